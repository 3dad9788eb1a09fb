#include "testing/multiprocess.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "testing/ports.h"

namespace tether::testing {
namespace {

constexpr char kRankVar[] = "TETHER_TEST_WORKER_RANK";

struct Proc {
  pid_t pid = -1;
  int fd = -1;
  std::string partial;
  bool running = true;
  int status = 0;
};

void print_lines(int rank, std::string& partial, bool all) {
  size_t start = 0;
  for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    std::printf("[rank %d] %s\n", rank, partial.substr(start, nl - start).c_str());
  }
  partial.erase(0, start);
  if (all && !partial.empty()) {
    std::printf("[rank %d] %s\n", rank, partial.c_str());
    partial.clear();
  }
  std::fflush(stdout);
}

}  // namespace

bool in_worker_process() { return std::getenv(kRankVar) != nullptr; }

void run_in_processes(int world_size,
                      const std::function<void(int, int)>& body,
                      absl::Duration deadline,
                      const std::vector<int>& may_die) {
  if (const char* rank_env = std::getenv(kRankVar)) {
    int rank = -1;
    if (!absl::SimpleAtoi(rank_env, &rank)) std::_Exit(3);
    body(rank, world_size);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  }

  const ::testing::TestInfo* test =
      ::testing::UnitTest::GetInstance()->current_test_info();
  std::string filter = absl::StrCat("--gtest_filter=", test->test_suite_name(),
                                    ".", test->name());
  int port = pick_unused_port();
  ASSERT_GT(port, 0) << "no free port for the rendezvous";

  std::vector<Proc> procs(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) {
      ::setpgid(0, 0);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::setenv(kRankVar, std::to_string(rank).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      // Bazel's sharding and XML output are the parent's business.
      ::unsetenv("GTEST_SHARD_INDEX");
      ::unsetenv("GTEST_TOTAL_SHARDS");
      ::unsetenv("XML_OUTPUT_FILE");
      ::unsetenv("GTEST_OUTPUT");
      ::execl("/proc/self/exe", "/proc/self/exe", filter.c_str(),
              static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    ::close(fds[1]);
    ::setpgid(pid, pid);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    procs[rank].pid = pid;
    procs[rank].fd = fds[0];
  }

  const absl::Time end = absl::Now() + deadline;
  int running = world_size;
  int failed_rank = -1;
  bool timed_out = false;
  while (running > 0) {
    std::vector<pollfd> polls;
    std::vector<int> ranks;
    for (int rank = 0; rank < world_size; ++rank) {
      if (procs[rank].fd >= 0) {
        polls.push_back({procs[rank].fd, POLLIN, 0});
        ranks.push_back(rank);
      }
    }
    ::poll(polls.data(), polls.size(), 50);
    for (size_t p = 0; p < polls.size(); ++p) {
      if (polls[p].revents == 0) continue;
      Proc& proc = procs[ranks[p]];
      char buffer[4096];
      ssize_t n = ::read(proc.fd, buffer, sizeof(buffer));
      if (n > 0) {
        proc.partial.append(buffer, static_cast<size_t>(n));
        print_lines(ranks[p], proc.partial, false);
      } else if (n == 0 || errno != EAGAIN) {
        print_lines(ranks[p], proc.partial, true);
        ::close(proc.fd);
        proc.fd = -1;
      }
    }
    for (int rank = 0; rank < world_size; ++rank) {
      Proc& proc = procs[rank];
      if (!proc.running ||
          ::waitpid(proc.pid, &proc.status, WNOHANG) != proc.pid) {
        continue;
      }
      proc.running = false;
      --running;
      bool ok = (WIFEXITED(proc.status) && WEXITSTATUS(proc.status) == 0) ||
                std::find(may_die.begin(), may_die.end(), rank) != may_die.end();
      if (!ok && failed_rank < 0) failed_rank = rank;
    }
    if ((failed_rank >= 0 || absl::Now() > end) && running > 0) {
      timed_out = failed_rank < 0;
      for (Proc& proc : procs) {
        if (proc.running) ::kill(-proc.pid, SIGKILL);
      }
    }
  }
  for (int rank = 0; rank < world_size; ++rank) {
    Proc& proc = procs[rank];
    if (proc.fd >= 0) {
      char buffer[4096];
      ssize_t n;
      while ((n = ::read(proc.fd, buffer, sizeof(buffer))) > 0) {
        proc.partial.append(buffer, static_cast<size_t>(n));
      }
      print_lines(rank, proc.partial, true);
      ::close(proc.fd);
    }
  }
  EXPECT_FALSE(timed_out) << "workers still running after "
                          << absl::FormatDuration(deadline) << "; killed";
  if (failed_rank >= 0) {
    const int status = procs[failed_rank].status;
    ADD_FAILURE() << "worker rank " << failed_rank << " failed: "
                  << (WIFEXITED(status)
                          ? absl::StrCat("exit code ", WEXITSTATUS(status))
                          : absl::StrCat("signal ", WTERMSIG(status)));
  }
}

}  // namespace tether::testing
