// A signal that ends a process ends a tether worker too: at once, whatever
// it is doing, and by that signal, so its parent (a launcher, a scheduler,
// the shell) sees what happened. Each case starts testing/signals'
// signal_victim, a process of two workers on a real backend over loopback,
// and checks how it ends:
//
// - SIGTERM while one worker multiplies matrices in a call and the other's
//   main thread waits for its answer, many times over: each process is
//   killed by SIGTERM (WIFSIGNALED, WTERMSIG 15) within kExitBound;
// - std::abort() and a write through a null pointer in a called function:
//   killed by SIGABRT and SIGSEGV.
//
// Before libfabric was opened only when chosen, every tether process
// carried libinfinipath's handlers for these signals, which print
// "terminated with signal N" and call exit() inside the handler: a crash
// became exit status 1, and SIGTERM could leave the process stuck in its
// exit handlers for ever (docs/reliability.md, "Signals").
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr char kVictim[] = "testing/signals/signal_victim";
// A worker killed by a signal is gone in milliseconds; the bound leaves room
// for a loaded 2-core machine, not for a process stuck in exit handlers.
constexpr absl::Duration kExitBound = absl::Seconds(5);
// Loading LibTorch and making two workers, on a loaded machine.
constexpr absl::Duration kStartBound = absl::Seconds(90);
constexpr int kSigtermRounds = 8;

struct Variant {
  const char* label;
  const char* backend;
  const char* settings;
};

// One signal_victim process, its output on a pipe.
class Victim {
 public:
  Victim(const Variant& variant, const char* mode) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    ::posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    std::vector<std::string> args = {kVictim, variant.backend,
                                     *variant.settings ? variant.settings : "-",
                                     mode};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, kVictim, &actions, nullptr,
                                 argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) {
      ::close(fds[0]);
      pid_ = -1;
      output_ = absl::StrCat("posix_spawn: ", std::strerror(rc));
      return;
    }
    out_ = fds[0];
    ::fcntl(out_, F_SETFL, O_NONBLOCK);
    // glibc 2.36's <sys/pidfd.h> declares pidfd_open without C linkage.
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }

  ~Victim() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  bool started() const { return pid_ > 0 && pidfd_ >= 0; }
  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads output until a line is `line`; false at the end of the output or
  // past the deadline.
  bool wait_for_line(const std::string& line, absl::Time deadline) {
    const std::string wanted = line + "\n";
    while (output_.find(wanted) == std::string::npos) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      pollfd readable{out_, POLLIN, 0};
      if (::poll(&readable, 1,
                 static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) != 1) {
        continue;
      }
      char buffer[4096];
      const ssize_t n = ::read(out_, buffer, sizeof(buffer));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return false;
      if (n > 0) output_.append(buffer, static_cast<size_t>(n));
    }
    return true;
  }

  // Waits for the process to end (its pidfd becomes readable) until
  // `deadline`; its wait status, or -1 if it is still running.
  int wait_for_exit(absl::Time deadline) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    pollfd ended{pidfd_, POLLIN, 0};
    if (::poll(&ended, 1, static_cast<int>(absl::ToInt64Milliseconds(left))) != 1) {
      return -1;
    }
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return -1;
    reaped_ = true;
    return status;
  }

  // The output the process wrote until now (after it ended: all of it).
  std::string drain() {
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(out_, buffer, sizeof(buffer))) > 0) {
      output_.append(buffer, static_cast<size_t>(n));
    }
    return output_;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
  std::string output_;
};

std::string describe_status(int status) {
  if (status < 0) return "still running";
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        sigdescr_np(WTERMSIG(status)), ")");
  }
  return absl::StrCat("wait status ", status);
}

// gtest names a case by its label.
void PrintTo(const Variant& variant, std::ostream* out) { *out << variant.label; }

class FatalSignals : public ::testing::TestWithParam<Variant> {};

TEST_P(FatalSignals, SigtermEndsABusyWorkerPromptly) {
  std::vector<absl::Duration> times;
  for (int round = 0; round < kSigtermRounds; ++round) {
    Victim victim(GetParam(), "busy");
    ASSERT_TRUE(victim.started()) << victim.output();
    ASSERT_TRUE(victim.wait_for_line("spinning", absl::Now() + kStartBound))
        << "round " << round << ": the worker never got busy:\n"
        << victim.output();
    const absl::Time sent = absl::Now();
    ASSERT_EQ(::kill(victim.pid(), SIGTERM), 0);
    const int status = victim.wait_for_exit(sent + kExitBound);
    const absl::Duration took = absl::Now() - sent;
    EXPECT_TRUE(status >= 0 && WIFSIGNALED(status) &&
                WTERMSIG(status) == SIGTERM)
        << "round " << round << ": after SIGTERM, " << describe_status(status)
        << " after " << took << "; output:\n"
        << victim.drain();
    times.push_back(took);
  }
  std::sort(times.begin(), times.end());
  std::printf("%s: SIGTERM to a busy worker, %zu rounds: exit after %s "
              "(median) to %s (max)\n",
              GetParam().label, times.size(),
              absl::FormatDuration(times[times.size() / 2]).c_str(),
              absl::FormatDuration(times.back()).c_str());
}

// The function a worker calls crashes the callee's process: the status
// says which signal, as for any program.
void expect_crash(const Variant& variant, const char* mode, int signal) {
  Victim victim(variant, mode);
  ASSERT_TRUE(victim.started()) << victim.output();
  const absl::Time start = absl::Now();
  const int status = victim.wait_for_exit(start + kStartBound);
  EXPECT_TRUE(status >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == signal)
      << mode << ": " << describe_status(status) << "; output:\n"
      << victim.drain();
  std::printf("%s: %s in a called function: %s\n", variant.label, mode,
              describe_status(status).c_str());
}

TEST_P(FatalSignals, AbortEndsTheWorkerWithSigabrt) {
  expect_crash(GetParam(), "abort", SIGABRT);
}

TEST_P(FatalSignals, SegfaultEndsTheWorkerWithSigsegv) {
  expect_crash(GetParam(), "segv", SIGSEGV);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, FatalSignals,
    ::testing::Values(Variant{"tensorpipe", "tensorpipe", ""},
                      Variant{"grpc", "grpc", ""},
                      Variant{"libfabric_tcp", "libfabric",
                              "libfabric.provider=tcp;ofi_rxm"},
                      Variant{"libfabric_shm", "libfabric",
                              "libfabric.provider=shm"}),
    [](const ::testing::TestParamInfo<Variant>& info) {
      return std::string(info.param.label);
    });

}  // namespace
