// tether_run: starts N local worker processes the way cluster launchers do.
//
//   tether_run --nproc 4 [--master_port P] [--grace_ms 5000] -- PROGRAM ARGS
//   tether_run [--nproc N] -- PROG0 ARGS : PROG1 ARGS : ...
//
// With programs separated by a lone ":" (as mpirun's MPMD form), rank r runs
// the r-th one; without --nproc there is one rank per program, and with a
// larger --nproc the last program runs on the remaining ranks.
//
// Each child gets MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, LOCAL_RANK and
// WORLD_SIZE, so `init_method = "env://"` with rank and world size -1 just
// works. The launcher itself serves the rendezvous store on MASTER_PORT (a
// port the kernel picks unless given), as torchrun's agent does, and says so
// with TORCHELASTIC_USE_AGENT_STORE=True: rank 0 connects to it as a client.
// So the port is bound from before the first worker starts until the last
// one ends (no other process can take it in between), and the store
// outlives every worker that needs it, whichever exits first. Their output is streamed line by line,
// prefixed by rank. When one child fails (non-zero exit or a signal) the
// others get SIGTERM, then SIGKILL after the grace period, and tether_run
// exits non-zero naming the first failure; it exits 0 only if all succeed.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
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

// The environment of rank `rank`'s process: ours, with the launcher's
// variables set.
std::vector<std::string> child_environment(int rank, int nproc, int port) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", std::to_string(port)},
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(nproc)},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
  };
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    bool replaced = false;
    for (const auto& [name, value] : ours) {
      if (entry.rfind(name + "=", 0) == 0) replaced = true;
    }
    if (!replaced) env.push_back(std::move(entry));
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

constexpr char kUsage[] =
    "usage: tether_run --nproc N [--master_port P] [--grace_ms MS] -- "
    "PROGRAM [ARGS...]\n"
    "       tether_run [--nproc N] [...] -- PROG0 [ARGS...] : PROG1 [ARGS...] "
    ": ...\n"
    "\n"
    "Starts N worker processes on this machine the way cluster launchers do.\n"
    "Each gets MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, LOCAL_RANK,\n"
    "WORLD_SIZE and TORCHELASTIC_USE_AGENT_STORE=True: tether_run serves the\n"
    "rendezvous store on MASTER_PORT itself (a free port unless --master_port\n"
    "gives one) for the workers' whole life. Output is prefixed by rank. When\n"
    "a worker fails the others get SIGTERM, then SIGKILL after --grace_ms\n"
    "(5000); the exit status is 0 only if every worker succeeded.\n"
    "\n"
    "Programs separated by a lone ':' run per rank: rank r runs the r-th;\n"
    "without --nproc there is one rank per program, with a larger --nproc the\n"
    "last program runs on the remaining ranks.\n";

int usage(const char* why) {
  std::fprintf(stderr, "tether_run: %s\n%s", why, kUsage);
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
  int nproc = -1;  // -1: one rank per program
  int port = 0;
  int grace_ms = 5000;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
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
  if (i >= argc) return usage("no program given after --");
  // The command of each rank: the segments between lone ":" arguments.
  std::vector<std::vector<char*>> programs(1);
  for (int a = i; a < argc; ++a) {
    if (std::string(argv[a]) == ":") {
      programs.emplace_back();
    } else {
      programs.back().push_back(argv[a]);
    }
  }
  for (auto& program : programs) {
    if (program.empty()) return usage("an empty program between ':'");
    program.push_back(nullptr);
  }
  if (nproc == -1) nproc = static_cast<int>(programs.size());
  if (nproc < 1 || nproc > 1024) return usage("--nproc must be in [1, 1024]");
  if (static_cast<int>(programs.size()) > nproc) {
    return usage("more programs than ranks (--nproc)");
  }
  if (port < 0 || port > 65535) return usage("bad --master_port");
  // The rendezvous store, served from here for the workers' whole life.
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = std::chrono::hours(24);
    store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tether_run: cannot serve the rendezvous store on "
                 "port %d: %s\n", port, e.what());
    return 1;
  }
  port = store->getPort();

  std::vector<Child> children(nproc);
  for (int rank = 0; rank < nproc; ++rank) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("tether_run: pipe");
      return 1;
    }
    // Built before fork(): between fork and exec a child of this
    // multi-threaded process may only make async-signal-safe calls.
    std::vector<std::string> env = child_environment(rank, nproc, port);
    std::vector<char*> envp;
    for (std::string& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
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
      // Not the store's sockets nor the other workers' pipes.
      ::close_range(3, ~0U, 0);
      char** command = programs[std::min<size_t>(
                                     rank, programs.size() - 1)].data();
      ::execvpe(command[0], command, envp.data());
      const char* why = std::strerror(errno);
      const char* parts[] = {"tether_run: cannot run ", command[0], ": ", why,
                             "\n"};
      for (const char* part : parts) {
        (void)!::write(STDERR_FILENO, part, std::strlen(part));
      }
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
