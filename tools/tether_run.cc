// tether_run: starts N local worker processes the way cluster launchers do.
//
//   tether_run --nproc 4 [--master_port P] [--grace_ms 5000]
//              [--max_restarts K [--elastic]] -- PROGRAM ARGS
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
// outlives every worker that needs it, whichever exits first. Their output
// is streamed line by line, prefixed by rank.
//
// How a run ends (docs/reliability.md, "Launchers and faults"):
// - When a worker fails (non-zero exit or a signal), the others' process
//   groups get SIGTERM, then SIGKILL after the grace period. tether_run's
//   exit status is the first failed worker's: its exit code, or 128 + the
//   signal that killed it, as a shell reports it; stderr names its rank.
// - SIGINT, SIGTERM or SIGHUP to tether_run is passed on, as it came, to
//   every worker's process group, SIGKILL after the grace period (at once
//   on a second signal); the exit status is then 128 + that signal. A
//   signal that tether_run's parent left ignored (nohup, a script's
//   background job and SIGINT) stays ignored.
// - With --max_restarts K (torchrun's flag and meaning), once the workers
//   of a failed attempt have all ended, every worker starts again, at most
//   K times, with a line on stderr per restart (which rank failed, how,
//   restart i of K). The store lives on; each attempt's workers get
//   TORCHELASTIC_RESTART_COUNT (0, 1, ...), under which env:// keeps the
//   attempt's keys apart, as torchrun's workers do. The exit status is the
//   last attempt's; a signal to tether_run is never followed by a restart.
//   With --elastic too, a failed rank other than 0 is started again alone,
//   in the same attempt, with TETHER_REJOIN=1 (RpcOptions::rejoin): its
//   program rejoins the others' dynamic group under its old name while
//   they run on. Rank 0 failing still restarts the world (in the main job
//   it is the parameter server, the owner of the shared state).
// - When tether_run dies without a chance to stop them (SIGKILL, a crash),
//   each worker gets SIGKILL from the kernel (PR_SET_PDEATHSIG): none runs
//   on without it. That reaches the worker, not processes the worker
//   started itself.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

// The signals tether_run passes on to its workers.
constexpr int kPassedOn[] = {SIGINT, SIGTERM, SIGHUP};

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
std::vector<std::string> child_environment(int rank, int nproc, int port,
                                           int restart, int max_restarts,
                                           bool rejoin) {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", std::to_string(port)},
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(nproc)},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)},
  };
  // RpcOptions::rejoin: this rank's last process is dead (reaped here), so
  // the new one takes its place in the running dynamic group.
  if (rejoin) ours.emplace_back("TETHER_REJOIN", "1");
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
    "usage: tether_run --nproc N [--master_port P] [--grace_ms MS] "
    "[--max_restarts K [--elastic]] -- PROGRAM [ARGS...]\n"
    "       tether_run [--nproc N] [...] -- PROG0 [ARGS...] : PROG1 [ARGS...] "
    ": ...\n"
    "\n"
    "Starts N worker processes on this machine the way cluster launchers do.\n"
    "Options take their value after a space or an '=' (--nproc=4).\n"
    "Each gets MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, LOCAL_RANK,\n"
    "WORLD_SIZE and TORCHELASTIC_USE_AGENT_STORE=True: tether_run serves the\n"
    "rendezvous store on MASTER_PORT itself (a free port unless --master_port\n"
    "gives one) for the workers' whole life. Output is prefixed by rank.\n"
    "\n"
    "When a worker fails the others get SIGTERM, then SIGKILL after --grace_ms\n"
    "(5000), and the exit status is the first failed worker's: its exit code,\n"
    "or 128 + the signal that killed it; the last line on stderr names it:\n"
    "  tether_run: failed: rank 1 first, killed by signal 9 (Killed)\n"
    "SIGINT, SIGTERM and SIGHUP are passed on to every worker as they came,\n"
    "SIGKILL after --grace_ms (at once on a second signal); the exit status\n"
    "is then 128 + the signal. If tether_run itself is killed, its workers\n"
    "are killed with it. 0 only if every worker succeeded.\n"
    "\n"
    "--max_restarts K (0): as torchrun's, when a worker fails and the others\n"
    "have ended, all are started again, at most K times, with the same\n"
    "store and TORCHELASTIC_RESTART_COUNT=1, 2, ... (env:// keeps each\n"
    "attempt's keys apart); a line on stderr says so:\n"
    "  tether_run: restart 1 of 2: rank 1 killed by signal 9 (Killed); ...\n"
    "A program that checkpoints resumes from its last checkpoint. The exit\n"
    "status is then the last attempt's. A signal to tether_run ends the run.\n"
    "--elastic (with --max_restarts): a failed rank other than 0 starts again\n"
    "alone, with TETHER_REJOIN=1, while the others run on; its program\n"
    "rejoins their dynamic group (examples/train --elastic). Rank 0 failing\n"
    "restarts them all. Each restart counts toward K.\n"
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

// Prints what is left of an ended child's output and closes its pipe.
void drain_output(Child& child) {
  if (child.out_fd < 0) return;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(child.out_fd, buffer, sizeof(buffer))) > 0) {
    child.partial.append(buffer, static_cast<size_t>(n));
  }
  flush_lines(child, true);
  ::close(child.out_fd);
  child.out_fd = -1;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "stopped";
}

// The exit status a shell would report for a process that ended so.
int shell_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev)
                           : absl::StrCat("signal ", sig);
}

// The signals the launcher takes (SIGCHLD and those of kPassedOn its parent
// did not leave ignored), blocked in every thread and read from a signalfd
// in the main loop: no handler, no race with poll(), and a worker's end
// wakes the loop at once.
struct Signals {
  sigset_t taken;
  sigset_t original;  // the mask to restore in the workers
  int fd = -1;
};

bool take_signals(Signals& signals) {
  sigemptyset(&signals.taken);
  sigaddset(&signals.taken, SIGCHLD);
  for (int sig : kPassedOn) {
    struct sigaction action {};
    if (::sigaction(sig, nullptr, &action) == 0 &&
        action.sa_handler != SIG_IGN) {
      sigaddset(&signals.taken, sig);
    }
  }
  // Before any thread starts (the store's), so that they all block them.
  if (::pthread_sigmask(SIG_BLOCK, &signals.taken, &signals.original) != 0) {
    return false;
  }
  signals.fd = ::signalfd(-1, &signals.taken, SFD_NONBLOCK | SFD_CLOEXEC);
  return signals.fd >= 0;
}

// Signals every running worker's process group.
void signal_workers(std::vector<Child>& children, int sig) {
  for (Child& child : children) {
    if (child.running) ::kill(-child.pid, sig);
  }
}

std::string running_ranks(const std::vector<Child>& children) {
  std::vector<int> ranks;
  for (const Child& child : children) {
    if (child.running) ranks.push_back(child.rank);
  }
  return absl::StrJoin(ranks, ", ");
}

// Runs one round: waits for every worker of `children` to end, streaming
// their output, passing signals on, stopping the others when one fails.
// Sets `first_failure` to the rank that failed first (if one did) and
// `interrupted_by` to the first signal passed on (if one came).
// With --elastic, `restart_alone` is called for a failed worker while the
// others run on: true if it started that rank again.
void run_round(std::vector<Child>& children, const Signals& signals,
               int grace_ms, int& first_failure, int& interrupted_by,
               const std::function<bool(Child&)>& restart_alone) {
  int running = static_cast<int>(children.size());
  bool stopping = false;  // the workers were told to stop
  bool killed = false;    // and then killed
  std::chrono::steady_clock::time_point kill_at{};
  const auto stop = [&](int sig) {
    signal_workers(children, sig);
    stopping = true;
    kill_at = std::chrono::steady_clock::now() +
              std::chrono::milliseconds(grace_ms);
  };
  const auto kill_now = [&](const char* why) {
    if (running > 0) {
      std::fprintf(stderr, "tether_run: %s; killing rank(s) %s\n", why,
                   running_ranks(children).c_str());
    }
    signal_workers(children, SIGKILL);
    killed = true;
  };
  while (running > 0) {
    std::vector<pollfd> polls = {{signals.fd, POLLIN, 0}};
    std::vector<Child*> owners = {nullptr};
    for (Child& child : children) {
      if (child.out_fd >= 0) {
        polls.push_back({child.out_fd, POLLIN, 0});
        owners.push_back(&child);
      }
    }
    int timeout_ms = 1000;
    if (stopping && !killed) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          kill_at - std::chrono::steady_clock::now());
      timeout_ms = static_cast<int>(
          std::clamp<int64_t>(left.count() + 1, 0, timeout_ms));
    }
    ::poll(polls.data(), polls.size(), timeout_ms);
    signalfd_siginfo info;
    while (::read(signals.fd, &info, sizeof(info)) == sizeof(info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;  // reaped below
      if (!stopping) {
        std::fprintf(stderr,
                     "tether_run: %s received; passing it on to the workers "
                     "(SIGKILL after %d ms)\n",
                     signal_name(sig).c_str(), grace_ms);
        interrupted_by = sig;
        stop(sig);
      } else {
        // Also after a worker failed: a signal means no restart.
        if (interrupted_by == 0) interrupted_by = sig;
        if (!killed) {
          kill_now(absl::StrCat(signal_name(sig), " received again").c_str());
        }
      }
    }
    for (size_t p = 1; p < polls.size(); ++p) {
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
      if (ok) continue;
      if (!stopping && restart_alone && restart_alone(child)) {
        ++running;
        continue;
      }
      if (!stopping) {
        first_failure = child.rank;
        std::fprintf(stderr,
                     "tether_run: rank %d %s; stopping the others (SIGTERM, "
                     "SIGKILL after %d ms)\n",
                     child.rank, describe_exit(child.status).c_str(), grace_ms);
        stop(SIGTERM);
      } else {
        std::fprintf(stderr, "tether_run: rank %d then %s\n", child.rank,
                     describe_exit(child.status).c_str());
      }
    }
    if (stopping && !killed && std::chrono::steady_clock::now() >= kill_at) {
      kill_now(absl::StrCat("the grace of ", grace_ms, " ms is over").c_str());
    }
  }
  for (Child& child : children) drain_output(child);
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = -1;  // -1: one rank per program
  int port = 0;
  int grace_ms = 5000;
  int max_restarts = 0;
  bool elastic = false;
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
    if (arg == "--elastic") {
      elastic = true;
      continue;
    }
    // "--name VALUE" or, as torchrun takes them too, "--name=VALUE".
    std::string value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return usage(("missing value for " + arg).c_str());
    }
    if (arg == "--nproc") {
      if (!absl::SimpleAtoi(value, &nproc)) return usage("bad --nproc");
    } else if (arg == "--master_port") {
      if (!absl::SimpleAtoi(value, &port)) return usage("bad --master_port");
    } else if (arg == "--max_restarts") {
      if (!absl::SimpleAtoi(value, &max_restarts) || max_restarts < 0) {
        return usage("bad --max_restarts");
      }
    } else if (arg == "--grace_ms") {
      if (!absl::SimpleAtoi(value, &grace_ms) || grace_ms < 0) {
        return usage("bad --grace_ms");
      }
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
  Signals signals;
  if (!take_signals(signals)) {
    std::perror("tether_run: signals");
    return 1;
  }
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

  const pid_t launcher = ::getpid();
  // Starts rank `rank` of round `restart` as `child`; false (with the reason
  // on stderr) if it could not.
  const auto spawn = [&](Child& child, int rank, int restart, bool rejoin) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("tether_run: pipe");
      return false;
    }
    // Built before fork(): between fork and exec a child of this
    // multi-threaded process may only make async-signal-safe calls.
    std::vector<std::string> env =
        child_environment(rank, nproc, port, restart, max_restarts, rejoin);
    std::vector<char*> envp;
    for (std::string& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
    // Forked by the main thread, which lives as long as the launcher: the
    // parent-death signal comes when the forking thread ends.
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("tether_run: fork");
      ::close(fds[0]);
      ::close(fds[1]);
      return false;
    }
    if (pid == 0) {
      // Its own process group, so stopping a worker stops what it started.
      ::setpgid(0, 0);
      // Dies with the launcher. If the launcher died before this line, no
      // signal will come: the parent is no longer the launcher, so go.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) {
        ::_exit(127);
      }
      ::sigprocmask(SIG_SETMASK, &signals.original, nullptr);
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
    child = Child{};
    child.rank = rank;
    child.pid = pid;
    child.out_fd = fds[0];
    return true;
  };

  std::vector<Child> children(nproc);
  int first_failure = -1;
  int interrupted_by = 0;  // the first signal passed on
  int restarts = 0;        // of the world and of single ranks
  int attempt = 0;         // of the world
  // --elastic: a failed rank other than 0 starts again alone, in the same
  // attempt, and rejoins the running group (its program runs in a dynamic
  // group); rank 0 serves the shared state, so losing it restarts the world.
  std::function<bool(Child&)> restart_alone;
  if (elastic) {
    restart_alone = [&](Child& child) {
      if (child.rank == 0 || restarts == max_restarts) return false;
      ++restarts;
      std::fprintf(stderr,
                   "tether_run: restart %d of %d: rank %d %s; starting rank "
                   "%d alone again, to rejoin the others\n",
                   restarts, max_restarts, child.rank,
                   describe_exit(child.status).c_str(), child.rank);
      drain_output(child);
      return spawn(child, child.rank, attempt, /*rejoin=*/true);
    };
  }
  for (;; ++attempt) {
    first_failure = -1;
    for (int rank = 0; rank < nproc; ++rank) {
      if (!spawn(children[rank], rank, attempt, /*rejoin=*/false)) {
        signal_workers(children, SIGKILL);
        return 1;
      }
    }
    run_round(children, signals, grace_ms, first_failure, interrupted_by,
              restart_alone);
    if (first_failure < 0 || interrupted_by != 0 || restarts == max_restarts) {
      if (first_failure >= 0 && restarts > 0) {
        std::fprintf(stderr, "tether_run: no restart left (--max_restarts "
                     "%d)\n", max_restarts);
      }
      break;
    }
    // torchrun's meaning: every worker starts again, in a new attempt of
    // the same rendezvous (TORCHELASTIC_RESTART_COUNT keeps the keys of
    // each attempt apart in the store, which lives on).
    ++restarts;
    std::fprintf(stderr,
                 "tether_run: restart %d of %d: rank %d %s; starting all %d "
                 "workers again\n",
                 restarts, max_restarts, first_failure,
                 describe_exit(children[first_failure].status).c_str(), nproc);
  }
  int exit_status = 0;
  if (first_failure >= 0) {
    const int status = children[first_failure].status;
    std::fprintf(stderr, "tether_run: failed: rank %d first, %s\n",
                 first_failure, describe_exit(status).c_str());
    exit_status = shell_status(status);
  } else if (interrupted_by != 0) {
    exit_status = 128 + interrupted_by;
  }
  // Nothing to tear down: LibTorch's static destructors alone would keep
  // whoever waits for the launcher 0.1 s or more after the last worker.
  std::fflush(nullptr);
  ::_exit(exit_status);
}
