// tether_run: starts N local worker processes the way cluster launchers do.
//
//   tether_run --nproc 4 [--master_port P] [--grace_ms 5000] -- PROGRAM ARGS
//
// Each child gets MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port unless
// given), RANK, LOCAL_RANK and WORLD_SIZE, so `init_method = "env://"` with
// rank and world size -1 just works. Their output is streamed line by line,
// prefixed by rank. When one child fails (non-zero exit or a signal) the
// others get SIGTERM, then SIGKILL after the grace period, and tether_run
// exits non-zero naming the first failure; it exits 0 only if all succeed.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t interrupted = 0;

void on_signal(int) { interrupted = 1; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;  // the read end of the child's stdout+stderr
  std::string partial;
  bool running = true;
  int status = 0;
};

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "tether_run: %s\nusage: tether_run --nproc N [--master_port P] "
               "[--grace_ms MS] -- PROGRAM [ARGS...]\n",
               why);
  return 2;
}

void flush_lines(Child& child, bool all) {
  size_t start = 0;
  for (;;) {
    size_t nl = child.partial.find('\n', start);
    if (nl == std::string::npos) break;
    std::printf("[%d] %s\n", child.rank,
                child.partial.substr(start, nl - start).c_str());
    start = nl + 1;
  }
  child.partial.erase(0, start);
  if (all && !child.partial.empty()) {
    std::printf("[%d] %s\n", child.rank, child.partial.c_str());
    child.partial.clear();
  }
  std::fflush(stdout);
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "stopped";
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0;
  int port = 0;
  int grace_ms = 5000;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) return usage(("missing value for " + arg).c_str());
    if (arg == "--nproc") {
      if (!absl::SimpleAtoi(argv[++i], &nproc)) return usage("bad --nproc");
    } else if (arg == "--master_port") {
      if (!absl::SimpleAtoi(argv[++i], &port)) return usage("bad --master_port");
    } else if (arg == "--grace_ms") {
      if (!absl::SimpleAtoi(argv[++i], &grace_ms)) return usage("bad --grace_ms");
    } else {
      return usage(("unknown option " + arg).c_str());
    }
  }
  if (nproc < 1 || nproc > 1024) return usage("--nproc must be in [1, 1024]");
  if (i >= argc) return usage("no program given after --");
  if (port == 0) port = free_port();
  if (port <= 0 || port > 65535) return usage("no usable master port");

  std::vector<Child> children(nproc);
  for (int rank = 0; rank < nproc; ++rank) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("tether_run: pipe");
      return 1;
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("tether_run: fork");
      return 1;
    }
    if (pid == 0) {
      // Its own process group, so stopping a worker stops what it started.
      ::setpgid(0, 0);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::execvp(argv[i], argv + i);
      std::fprintf(stderr, "tether_run: cannot run %s: %s\n", argv[i],
                   std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    ::setpgid(pid, pid);
    // Never block on output: a grandchild may hold the pipe open.
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    children[rank].rank = rank;
    children[rank].pid = pid;
    children[rank].out_fd = fds[0];
  }

  // Workers sit in their own process groups: pass a Ctrl-C or SIGTERM on.
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);
  int first_failure = -1;
  int running = nproc;
  std::chrono::steady_clock::time_point kill_at{};
  bool terminating = false;
  while (running > 0) {
    std::vector<pollfd> polls;
    std::vector<Child*> owners;
    for (Child& child : children) {
      if (child.out_fd >= 0) {
        polls.push_back({child.out_fd, POLLIN, 0});
        owners.push_back(&child);
      }
    }
    ::poll(polls.data(), polls.size(), 100);
    for (size_t p = 0; p < polls.size(); ++p) {
      if (polls[p].revents == 0) continue;
      char buffer[4096];
      ssize_t n = ::read(polls[p].fd, buffer, sizeof(buffer));
      Child& child = *owners[p];
      if (n > 0) {
        child.partial.append(buffer, static_cast<size_t>(n));
        flush_lines(child, false);
      } else if (n < 0 && errno == EAGAIN) {
        continue;
      } else {
        flush_lines(child, true);
        ::close(child.out_fd);
        child.out_fd = -1;
      }
    }
    for (Child& child : children) {
      if (!child.running) continue;
      if (::waitpid(child.pid, &child.status, WNOHANG) != child.pid) continue;
      child.running = false;
      --running;
      bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0;
      if (!ok && first_failure < 0 && !terminating) {
        first_failure = child.rank;
        std::fprintf(stderr, "tether_run: rank %d %s; stopping the others\n",
                     child.rank, describe_exit(child.status).c_str());
        for (Child& other : children) {
          if (other.running) ::kill(-other.pid, SIGTERM);
        }
        terminating = true;
        kill_at = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(grace_ms);
      }
    }
    if (interrupted && !terminating) {
      std::fprintf(stderr, "tether_run: interrupted; stopping the workers\n");
      for (Child& other : children) {
        if (other.running) ::kill(-other.pid, SIGTERM);
      }
      terminating = true;
      kill_at = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(grace_ms);
    }
    if (terminating && std::chrono::steady_clock::now() >= kill_at) {
      for (Child& other : children) {
        if (other.running) ::kill(-other.pid, SIGKILL);
      }
    }
  }
  for (Child& child : children) {
    if (child.out_fd >= 0) {
      char buffer[4096];
      ssize_t n;
      while ((n = ::read(child.out_fd, buffer, sizeof(buffer))) > 0) {
        child.partial.append(buffer, static_cast<size_t>(n));
      }
      flush_lines(child, true);
      ::close(child.out_fd);
    }
  }
  if (interrupted && first_failure < 0) return 130;
  if (first_failure >= 0) {
    std::fprintf(stderr, "tether_run: failed (rank %d %s)\n", first_failure,
                 describe_exit(children[first_failure].status).c_str());
    return 1;
  }
  return 0;
}
