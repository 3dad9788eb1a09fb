#include "backends/libfabric/internal/kept_signals.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <thread>
#include <vector>

namespace tether::backends::libfabric::internal {
namespace {

void handler(int) {}
void other_handler(int) {}
void info_handler(int, siginfo_t*, void*) {}

void install(int signal, void (*function)(int), int flags = 0) {
  struct sigaction action {};
  action.sa_handler = function;
  action.sa_flags = flags;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(::sigaction(signal, &action, nullptr), 0);
}

struct sigaction current(int signal) {
  struct sigaction action {};
  EXPECT_EQ(::sigaction(signal, nullptr, &action), 0);
  return action;
}

// What libinfinipath's constructor does to a process, on signals a test
// process does not otherwise use.
void install_like_a_library() {
  install(SIGUSR1, handler);
  install(SIGTERM, handler);
  install(SIGHUP, SIG_IGN);
  struct sigaction action {};
  action.sa_sigaction = info_handler;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR2, &action, nullptr), 0);
}

class KeptSignalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int signal : {SIGUSR1, SIGUSR2, SIGTERM, SIGHUP, SIGALRM}) {
      install(signal, SIG_DFL);
    }
  }
  void TearDown() override { SetUp(); }
};

TEST_F(KeptSignalsTest, UndoesWhatCodeInstalledInTheScope) {
  {
    KeptSignals kept("a test");
    install_like_a_library();
    EXPECT_EQ(current(SIGTERM).sa_handler, handler);
  }
  EXPECT_EQ(KeptSignals::last_restored_count(), 4);
  for (int signal : {SIGUSR1, SIGUSR2, SIGTERM, SIGHUP}) {
    EXPECT_EQ(current(signal).sa_handler, SIG_DFL) << signal;
    EXPECT_EQ(current(signal).sa_flags & SA_SIGINFO, 0) << signal;
  }
}

TEST_F(KeptSignalsTest, KeepsWhatTheProgramChoseBefore) {
  install(SIGALRM, other_handler, SA_RESTART);
  install(SIGHUP, SIG_IGN);
  {
    KeptSignals kept("a test");
    install(SIGALRM, handler);
    install(SIGHUP, handler);
  }
  EXPECT_EQ(current(SIGALRM).sa_handler, other_handler);
  EXPECT_NE(current(SIGALRM).sa_flags & SA_RESTART, 0);
  EXPECT_EQ(current(SIGHUP).sa_handler, SIG_IGN);
}

TEST_F(KeptSignalsTest, NothingChangedNothingRestored) {
  { KeptSignals kept("a test"); }
  EXPECT_EQ(KeptSignals::last_restored_count(), 0);
}

TEST_F(KeptSignalsTest, ANestedScopeIsPartOfTheOuterOne) {
  {
    KeptSignals outer("outer");
    {
      KeptSignals inner("inner");
      install(SIGUSR1, handler);
    }
    // The inner scope's end restores nothing: the outer one owns the save.
    EXPECT_EQ(current(SIGUSR1).sa_handler, handler);
  }
  EXPECT_EQ(current(SIGUSR1).sa_handler, SIG_DFL);
}

// Two threads opening libfabric at once must not save each other's
// handlers as the program's.
TEST_F(KeptSignalsTest, ScopesOfSeveralThreadsRestoreEverything) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 50; ++i) {
        KeptSignals kept("a thread");
        install_like_a_library();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int signal : {SIGUSR1, SIGUSR2, SIGTERM, SIGHUP}) {
    EXPECT_EQ(current(signal).sa_handler, SIG_DFL) << signal;
  }
}

}  // namespace
}  // namespace tether::backends::libfabric::internal
