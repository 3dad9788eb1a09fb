// scale_worker: one worker of an N-process world, for the scale workload
// (init time, all-to-all rounds, fds and memory per world size).
//
//   bazel build -c opt //tools:tether_run //tools:scale_worker
//   bazel-bin/tools/tether_run --nproc 64 -- bazel-bin/tools/scale_worker
//       --backend=tensorpipe [--setting=KEY=VALUE]... [--label=TEXT]
//   bazel-bin/tools/tether_run --nproc 64 -- bazel-bin/tools/scale_worker
//       --bare
//
// The bench CLI (tools/bench.py --scale 2,4,...,64) runs it per backend
// variant and world size and summarizes the ranks' lines; this is the
// measuring half.
//
// Each rank joins the group (init_method env://, rank and world size from
// the launcher), then, between barriers of the whole group:
//   cold round   every rank calls every other at once (rpc_async of
//                aten::add.Scalar on a 2-element tensor, rank r starting at
//                r+1 so that no rank is everyone's first), and waits for
//                all; the first connections are made here
//   warm rounds  the same, --warm_rounds times (3); their median
// and prints one line `JSON {...}`: its init time, the round times, its
// open fds (/proc/self/fd; by kind too: fds_tcp, fds_tcp_listen, ...), the
// shared libraries mapped at main() and once up (shared_libraries,
// shared_libraries_up) and
// memory (VmHWM, VmRSS from
// /proc/self/status) after the warm rounds and at main(), its threads,
// the CPU time it had used when main() began (the dynamic loader's share
// of starting a process), the wall clock (unix seconds) at main() and once
// up, so that the launcher can tell launch-to-all-up, and the shutdown's
// duration. A failed call names the peer: "w3 -> w17: <status>".
// --hold_s=S waits S seconds after the warm rounds, before shutting down,
// so that a worker's fds can be listed from outside.
//
// With --bare it prints the same first fields and exits at once: what
// starting a process that loads this binary's libraries (LibTorch's among
// them) costs, with no RPC at all.
#include <ATen/ATen.h>
#include <absl/container/flat_hash_map.h>
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/builtin.h"
#include "core/status_macros.h"
#include "core/worker.h"
#include "tools/internal/json.h"
#include "tools/internal/launcher_env.h"

namespace tether::bench {
namespace {

struct Flags {
  std::string backend = "tensorpipe";
  std::string label;
  absl::flat_hash_map<std::string, std::string> settings;
  int warm_rounds = 3;
  int threads = 0;  // 0: RpcOptions' default
  absl::Duration call_timeout = absl::Seconds(120);
  absl::Duration init_timeout = absl::Seconds(300);
  bool bare = false;
  // Waits this long after the warm rounds, before shutting down: time to
  // list a worker's fds from outside (ls -l /proc/PID/fd, ss -tnp).
  absl::Duration hold = absl::ZeroDuration();
};

// ---- what the process holds ----

// Open file descriptors, without the one that lists them.
int64_t open_fds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;
}

// The TCP sockets of this network namespace, by inode: true if listening
// (/proc/self/net/tcp and tcp6, state 0A).
std::map<std::string, bool> tcp_sockets() {
  std::map<std::string, bool> out;
  for (const char* path : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream table(path);
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      std::vector<std::string> f =
          absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (f.size() > 9) out[f[9]] = f[3] == "0A";
    }
  }
  return out;
}

// The inodes of this network namespace's unix sockets (/proc/self/net/unix).
std::set<std::string> unix_sockets() {
  std::set<std::string> out;
  std::ifstream table("/proc/self/net/unix");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (f.size() > 6) out.insert(f[6]);
  }
  return out;
}

// Open fds by kind (readlink of each /proc/self/fd entry), as
// "fds_<kind>" keys: tcp_listen, tcp (connections), unix, socket (other
// families), eventfd, epoll, timerfd, memfd, pipe, file, other. Tells
// what a backend holds per peer (docs/benchmarks.md, "Scale").
void fd_kinds(JsonObject& out) {
  const std::map<std::string, bool> tcp = tcp_sockets();
  const std::set<std::string> unix_inodes = unix_sockets();
  std::map<std::string, int64_t> kinds;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) continue;
    char target[256];
    const std::string link = absl::StrCat("/proc/self/fd/", e->d_name);
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n < 0) continue;
    const std::string t(target, static_cast<size_t>(n));
    std::string kind = "other";
    if (t.rfind("socket:[", 0) == 0) {
      const std::string inode = t.substr(8, t.size() - 9);
      auto it = tcp.find(inode);
      kind = it != tcp.end()               ? (it->second ? "tcp_listen" : "tcp")
             : unix_inodes.count(inode) > 0 ? "unix"
                                            : "socket";
    } else if (t == "anon_inode:[eventfd]") {
      kind = "eventfd";
    } else if (t == "anon_inode:[eventpoll]") {
      kind = "epoll";
    } else if (t == "anon_inode:[timerfd]") {
      kind = "timerfd";
    } else if (t.rfind("/memfd:", 0) == 0) {
      kind = "memfd";
    } else if (t.rfind("pipe:", 0) == 0) {
      kind = "pipe";
    } else if (t.rfind("/", 0) == 0) {
      kind = "file";
    }
    ++kinds[kind];
  }
  closedir(dir);
  for (const auto& [kind, count] : kinds) {
    out.integer(absl::StrCat("fds_", kind), count);
  }
}

// A "Name:   value" line of /proc/self/status as a number (kB for Vm*).
int64_t proc_status(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = field + ":";
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) {
      int64_t v = -1;
      std::string rest(absl::StripAsciiWhitespace(line.substr(prefix.size())));
      if (!absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &v)) return -1;
      return v;
    }
  }
  return -1;
}

// Distinct shared objects mapped (/proc/self/maps).
int64_t shared_libraries() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::set<std::string> seen;
  while (std::getline(maps, line)) {
    size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (path.find(".so") != std::string::npos) seen.insert(std::move(path));
  }
  return static_cast<int64_t>(seen.size());
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Unix seconds with microseconds, as JSON: the launcher compares them across
// processes.
std::string unix_seconds(absl::Time t) {
  return absl::StrFormat("%.6f", absl::ToDoubleSeconds(t - absl::UnixEpoch()));
}

// ---- the rounds ----

// Every other rank called at once; the first failure, naming the peer.
absl::Status all_to_all(Worker& worker, int rank, int world_size,
                        absl::Duration timeout) {
  const at::Tensor x = at::ones({2});
  std::vector<std::pair<int, Future<c10::IValue>>> calls;
  calls.reserve(world_size - 1);
  for (int i = 1; i < world_size; ++i) {
    const int peer = (rank + i) % world_size;
    calls.emplace_back(peer, worker.rpc_async(peer, "aten::add.Scalar",
                                              {x, 1.0}, {}, timeout));
  }
  absl::Status first;
  const absl::Time deadline = absl::Now() + timeout + absl::Seconds(10);
  for (auto& [peer, call] : calls) {
    absl::StatusOr<c10::IValue> y = call.get(deadline);
    absl::Status s = y.status();
    if (s.ok() && !(y->isTensor() && y->toTensor().sum().item<double>() == 4.0)) {
      s = absl::InternalError(absl::StrCat("wrong answer ", y->tagKind()));
    }
    if (!s.ok() && first.ok()) {
      first = absl::Status(s.code(), absl::StrCat("w", rank, " -> w", peer, ": ",
                                                  s.message()));
    }
  }
  return first;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Everything after main()'s first measurements; fills `out`.
absl::Status run(const Flags& flags, const LauncherEnv& env, JsonObject& out) {
  BackendRegistry registry;
  TETHER_RETURN_IF_ERROR(backends::register_builtin_backends(registry));
  RpcOptions options;
  options.backend = flags.backend;
  options.init_method = "env://";
  options.backend_settings = flags.settings;
  options.init_timeout = flags.init_timeout;
  if (flags.threads > 0) options.num_worker_threads = flags.threads;

  const absl::Time init_start = absl::Now();
  absl::StatusOr<std::unique_ptr<Worker>> created = Worker::create(
      absl::StrCat("w", env.rank), env.rank, env.world_size, options, registry);
  if (!created.ok()) {
    return absl::Status(created.status().code(),
                        absl::StrCat("init: ", created.status().message()));
  }
  Worker& worker = **created;
  const absl::Time up = absl::Now();
  out.number("init_s", absl::ToDoubleSeconds(up - init_start));
  out.raw("up_unix", unix_seconds(up));
  out.integer("fds_up", open_fds());
  // What choosing the backend loaded (libfabric and its providers' libraries
  // are opened only when it is chosen; gRPC's are linked).
  out.integer("shared_libraries_up", shared_libraries());
  out.integer("rss_up_kb", proc_status("VmRSS"));

  auto step = [&](absl::string_view what, absl::Status s) -> absl::Status {
    if (s.ok()) return s;
    // Stops at once: a graceful shutdown would wait for the peers.
    (void)worker.shutdown(/*graceful=*/false);
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  };
  absl::Time t = absl::Now();
  TETHER_RETURN_IF_ERROR(step("barrier after init", worker.barrier({}, flags.call_timeout)));
  out.number("all_up_barrier_s", absl::ToDoubleSeconds(absl::Now() - t));

  t = absl::Now();
  TETHER_RETURN_IF_ERROR(step("cold round", all_to_all(worker, env.rank, env.world_size,
                                                       flags.call_timeout)));
  out.number("cold_round_s", absl::ToDoubleSeconds(absl::Now() - t));
  out.integer("fds_cold", open_fds());

  std::vector<double> warm;
  for (int i = 0; i < flags.warm_rounds; ++i) {
    TETHER_RETURN_IF_ERROR(step("barrier", worker.barrier({}, flags.call_timeout)));
    t = absl::Now();
    TETHER_RETURN_IF_ERROR(step("warm round", all_to_all(worker, env.rank, env.world_size,
                                                         flags.call_timeout)));
    warm.push_back(absl::ToDoubleSeconds(absl::Now() - t));
  }
  out.number("warm_round_s", median(warm));
  out.integer("fds", open_fds());
  fd_kinds(out);
  out.integer("vmhwm_kb", proc_status("VmHWM"));
  out.integer("vmrss_kb", proc_status("VmRSS"));
  out.integer("threads", proc_status("Threads"));
  if (flags.hold > absl::ZeroDuration()) {
    std::fprintf(stderr, "scale_worker rank %d (pid %d) holds for %s\n", env.rank,
                 static_cast<int>(getpid()), absl::FormatDuration(flags.hold).c_str());
    absl::SleepFor(flags.hold);
  }

  t = absl::Now();
  absl::Status down = worker.shutdown(true, flags.call_timeout);
  out.number("shutdown_s", absl::ToDoubleSeconds(absl::Now() - t));
  if (!down.ok()) {
    return absl::Status(down.code(), absl::StrCat("shutdown: ", down.message()));
  }
  return absl::OkStatus();
}

bool seconds_flag(const std::string& arg, const char* name, absl::Duration& out) {
  int s = 0;
  if (arg.rfind(name, 0) != 0 || !absl::SimpleAtoi(arg.substr(strlen(name)), &s) ||
      s <= 0) {
    return false;
  }
  out = absl::Seconds(s);
  return true;
}

int usage() {
  std::fprintf(stderr,
               "usage: scale_worker [--backend=NAME] [--setting=KEY=VALUE]... "
               "[--label=TEXT] [--warm_rounds=N] [--threads=N] "
               "[--call_timeout_s=S] [--init_timeout_s=S] [--hold_s=S]\n"
               "       scale_worker --bare\n"
               "Run under tether_run --nproc N (see the file's header).\n");
  return 2;
}

}  // namespace
}  // namespace tether::bench

int main(int argc, char** argv) {
  using namespace tether::bench;  // NOLINT
  // First, before anything this program does costs time of its own.
  const absl::Time main_at = absl::Now();
  const double cpu_at_main = cpu_seconds();
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--backend=", 0) == 0) {
      flags.backend = arg.substr(10);
    } else if (arg.rfind("--label=", 0) == 0) {
      flags.label = arg.substr(8);
    } else if (arg.rfind("--setting=", 0) == 0) {
      std::pair<std::string, std::string> kv =
          absl::StrSplit(arg.substr(10), absl::MaxSplits('=', 1));
      if (kv.first.empty()) return usage();
      flags.settings[kv.first] = kv.second;
    } else if (arg.rfind("--warm_rounds=", 0) == 0) {
      if (!absl::SimpleAtoi(arg.substr(14), &flags.warm_rounds) ||
          flags.warm_rounds < 1) {
        return usage();
      }
    } else if (arg.rfind("--threads=", 0) == 0) {
      if (!absl::SimpleAtoi(arg.substr(10), &flags.threads) || flags.threads < 1) {
        return usage();
      }
    } else if (seconds_flag(arg, "--call_timeout_s=", flags.call_timeout) ||
               seconds_flag(arg, "--init_timeout_s=", flags.init_timeout) ||
               seconds_flag(arg, "--hold_s=", flags.hold)) {
    } else if (arg == "--bare") {
      flags.bare = true;
    } else {
      return usage();
    }
  }
  const tether::LauncherEnv env = launched("scale_worker");
  JsonObject out;
  out.string("variant", flags.bare ? "bare" : flags.label.empty() ? flags.backend
                                                                   : flags.label);
  out.integer("rank", env.rank);
  out.integer("world_size", env.world_size);
  out.raw("main_unix", unix_seconds(main_at));
  out.number("cpu_s_at_main", cpu_at_main);
  out.integer("fds_at_main", open_fds());
  out.integer("rss_at_main_kb", proc_status("VmRSS"));
  out.integer("shared_libraries", shared_libraries());
  if (flags.bare) {
    out.string("status", "ok");
    print_json(out);
    return 0;
  }
  absl::Status s = run(flags, env, out);
  out.string("status", s.ok() ? "ok" : absl::StrCat("failed: ", s.ToString()));
  print_json(out);
  return s.ok() ? 0 : 1;
}
