// bench_worker: the bench's workloads between two local processes, for
// one backend variant, or the raw baselines; one JSON object per run.
//
//   bazel build -c opt //tools:tether_run //tools:bench_worker
//   cd bazel-bin/tools
//   ./tether_run --nproc 2 -- ./bench_worker --backend=tensorpipe
//       --setting=tensorpipe.transports=uv --setting=tensorpipe.channels=basic
//       --label="tensorpipe uv" [--quick]     (one command line)
//   ./tether_run --nproc 2 -- ./bench_worker --raw
//   ./bench_worker --list
//
// The bench CLI (tools/bench.py) runs it once per variant and once with
// --raw, and draws the table and plots; this is the measuring half.
//
// Rank 0 times every call (per-call samples after a warm-up, so p50 and p99
// are real percentiles) to rank 1 and prints one line `JSON {...}` with the
// bench's keys:
//   builtin_rpc_sync_p50_us, builtin_rpc_sync_p99_us  rpc_sync of
//       aten::add.Scalar on a 2-element float tensor and 1.0
//   builtin_rpc_async_calls_per_s   the same call, 64 in flight
//   builtin_rpc_sync_cpu_us_per_call, builtin_rpc_async_cpu_us_per_call
//       CPU time (user + system, every thread of both processes) over the
//       measured calls, per call
//   idle_cpu_percent_caller, idle_cpu_percent_callee  each process's CPU
//       over --idle_ms with no calls, after the small calls, in % of a core
//   remote_to_here_p50_us           remote() of that call, then to_here()
//   echo_1MB_GBps, echo_64MB_GBps   a uint8 tensor through an identity
//       operator and back (bytes counted both ways, per-call p50)
//   dist_autograd_step_p50_us       a context; forward of a remote
//       Linear(256, 256) (an RRef on rank 1, through its proxy) on a 64x256
//       input requiring grad; backward; get_gradients; the context's release
//       (local_autograd_step_p50_us: the same Linear's forward and backward
//       in rank 0 with plain LibTorch, alternating with the steps: the
//       floor of the step's compute)
//   sweep                           the echo per payload size, 8 B to 64 MiB
// With --raw: a TCP ping-pong per size (tcp_pingpong_p50_us at 8 B, the
// sweep), a one-way TCP stream (tcp_stream_GBps), memcpy into a reused and
// into a fresh buffer (memcpy_GBps, memcpy_fresh_GBps) and between buffers
// on transparent huge pages (memcpy_huge_pages_GBps), and TensorPipe's
// pipe alone over tether's tcp transport, 128 bytes each way and no tether
// RPC code (tp_pipe_alone_p50_us; tools/internal/tp_pipe.h).
//
// A backend that is not registered or not viable here (or a setting it
// refuses as not available) is not an error: both ranks print
// `"status": "n/a: ..."` and exit 0. A workload that fails prints
// `"status": "failed: ..."` and exits 1.
#include <ATen/ATen.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/time/clock.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "backends/builtin.h"
#include "core/huge_pages.h"
#include "core/worker.h"
#include "rref/rref.h"
#include "tools/internal/json.h"
#include "tools/internal/launcher_env.h"
#include "tools/internal/raw_baselines.h"
#include "tools/internal/tp_pipe.h"
#include "tools/internal/samples.h"
#include "tools/internal/workloads.h"

namespace tether::bench {
namespace {

// Iteration counts, {full, quick}; --NAME=N overrides one. The peer
// (tools/peer_bench.py) has the same presets.
struct Count {
  const char* name;
  int64_t full;
  int64_t quick;
  int64_t value = 0;
};

std::vector<Count> default_counts() {
  return {
      // As many in quick mode: with 300 (0.01 s of calls) the p50 of the
      // small call came out 1.5x to 3x that of 3000 on a virtual machine,
      // too short a stretch for a steady state, and 3000 take 0.1 s.
      {"sync_calls", 3000, 3000},
      {"async_calls", 20000, 2000},
      {"remote_calls", 1000, 200},
      {"autograd_steps", 300, 30},
      // Sweep iterations per size: clamp(sweep_bytes / size, min, max).
      {"sweep_bytes", int64_t{1} << 30, int64_t{64} << 20},
      {"sweep_min_iters", 10, 3},
      {"sweep_max_iters", 1000, 100},
      // --raw only.
      {"stream_bytes", int64_t{1} << 30, int64_t{256} << 20},
      {"memcpy_iters", 20, 5},
      // The idle stretch after the small calls, in milliseconds.
      {"idle_ms", 5000, 2000},
  };
}

struct Flags {
  std::string backend = "tensorpipe";
  std::string label;
  absl::flat_hash_map<std::string, std::string> settings;
  bool quick = false;
  bool raw = false;
  bool list = false;
  int64_t max_bytes = int64_t{64} << 20;
  std::vector<Count> counts = default_counts();

  int64_t count(absl::string_view name) const {
    for (const Count& c : counts) {
      if (name == c.name) return c.value;
    }
    std::fprintf(stderr, "bench_worker: no count %s\n", std::string(name).c_str());
    std::exit(2);
  }
};

// 8 B, then powers of 4 from 64 B to 64 MiB (1 MiB and 64 MiB included).
std::vector<int64_t> sweep_sizes(int64_t max_bytes) {
  std::vector<int64_t> sizes;
  if (max_bytes >= 8) sizes.push_back(8);
  for (int64_t s = 64; s <= max_bytes && s <= (int64_t{64} << 20); s *= 4) {
    sizes.push_back(s);
  }
  return sizes;
}

int sweep_iterations(const Flags& flags, int64_t bytes) {
  return static_cast<int>(std::clamp(flags.count("sweep_bytes") / bytes,
                                     flags.count("sweep_min_iters"),
                                     flags.count("sweep_max_iters")));
}

int warmup_of(int iterations, int at_least) {
  return std::max(at_least, iterations / 10);
}

// ---- JSON output (flat objects from tools/internal/json.h, one sweep list) ----

struct SweepRow {
  int64_t bytes = 0;
  int iterations = 0;
  Summary summary;
};

std::string sweep_json(const std::vector<SweepRow>& rows) {
  std::vector<std::string> items;
  for (const SweepRow& r : rows) {
    JsonObject o;
    o.integer("bytes", r.bytes);
    o.integer("iterations", r.iterations);
    o.number("p50_us", r.summary.p50_us);
    o.number("p99_us", r.summary.p99_us);
    o.number("GBps", gbps(2.0 * static_cast<double>(r.bytes), r.summary.p50_us));
    items.push_back(o.str());
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

// The GB/s of the sweep row of `bytes` (both ways), or NaN (null) if absent.
double sweep_gbps(const std::vector<SweepRow>& rows, int64_t bytes) {
  for (const SweepRow& r : rows) {
    if (r.bytes == bytes) {
      return gbps(2.0 * static_cast<double>(bytes), r.summary.p50_us);
    }
  }
  return std::nan("");
}

// ---- a backend variant ----

// Runs the workloads from rank 0; fills `out` with what it measured.
absl::Status run_workloads(Worker& worker, const Flags& flags, JsonObject& out) {
  const To peer(1);
  const at::Tensor x = small_tensor();
  auto step = [&](const char* what, absl::Status s) {
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    std::fprintf(stderr, "bench_worker: %s done\n", what);
    return s;
  };

  // CPU per call: both processes, all threads, over the measured calls.
  CpuUse cpu(worker, peer);
  auto cpu_per_call = [&](const char* key, int calls) -> absl::Status {
    absl::StatusOr<std::pair<double, double>> used = cpu.seconds();
    if (!used.ok()) return used.status();
    out.number(key, (used->first + used->second) / calls * 1e6);
    return absl::OkStatus();
  };

  const int sync_calls = static_cast<int>(flags.count("sync_calls"));
  std::vector<double> samples;
  absl::Status s = time_calls(warmup_of(sync_calls, 100), 0,
                              [&] { return add_sync(worker, peer, x); }, samples);
  if (s.ok()) s = cpu.start();
  if (s.ok()) {
    s = time_calls(0, sync_calls, [&] { return add_sync(worker, peer, x); }, samples);
  }
  if (s.ok()) s = cpu_per_call("builtin_rpc_sync_cpu_us_per_call", sync_calls);
  if (s = step("rpc_sync", s); !s.ok()) return s;
  const Summary sync = summarize(std::move(samples));
  out.number("builtin_rpc_sync_p50_us", sync.p50_us);
  out.number("builtin_rpc_sync_p99_us", sync.p99_us);

  const int async_calls = static_cast<int>(flags.count("async_calls"));
  s = add_async_window(worker, peer, x, std::max(4 * kAsyncWindow, async_calls / 10),
                       kAsyncWindow);
  if (s.ok()) s = cpu.start();
  const Clock::time_point start = Clock::now();
  if (s.ok()) s = add_async_window(worker, peer, x, async_calls, kAsyncWindow);
  const double async_us = micros_since(start);
  if (s.ok()) s = cpu_per_call("builtin_rpc_async_cpu_us_per_call", async_calls);
  if (s = step("rpc_async", s); !s.ok()) return s;
  out.number("builtin_rpc_async_calls_per_s", async_calls / (async_us * 1e-6));

  // Idle: no calls for a while after the calls; each process's share of a core.
  const double idle_s = static_cast<double>(flags.count("idle_ms")) / 1e3;
  s = cpu.start();
  if (s.ok()) {
    absl::SleepFor(absl::Seconds(idle_s));
    absl::StatusOr<std::pair<double, double>> used = cpu.seconds();
    s = used.status();
    if (s.ok()) {
      out.number("idle_cpu_percent_caller", 100 * used->first / idle_s);
      out.number("idle_cpu_percent_callee", 100 * used->second / idle_s);
    }
  }
  if (s = step("idle", s); !s.ok()) return s;

  const int remote_calls = static_cast<int>(flags.count("remote_calls"));
  samples.clear();
  s = time_calls(warmup_of(remote_calls, 20), remote_calls,
                 [&] { return add_remote_to_here(worker, peer, x); }, samples);
  if (s = step("remote+to_here", s); !s.ok()) return s;
  out.number("remote_to_here_p50_us", summarize(std::move(samples)).p50_us);

  {
    absl::StatusOr<RRef> linear = make_linear(worker, peer);
    if (!linear.ok()) return step("Linear on rank 1", linear.status());
    const at::Tensor input = linear_input();
    const int steps = static_cast<int>(flags.count("autograd_steps"));
    // Each step alternates with the same compute here in plain LibTorch:
    // the step's floor, under the same conditions.
    LocalLinear local;
    const at::Tensor local_input = linear_input();
    std::vector<double> floor;
    samples.clear();
    s = time_alternating(
        warmup_of(steps, 5), steps,
        [&] { return autograd_step(worker, *linear, input); },
        [&] {
          local.step(local_input);
          return absl::OkStatus();
        },
        samples, floor);
    if (s = step("dist autograd step", s); !s.ok()) return s;
    out.number("dist_autograd_step_p50_us", summarize(std::move(samples)).p50_us);
    out.number("local_autograd_step_p50_us", summarize(std::move(floor)).p50_us);
  }

  std::vector<SweepRow> rows;
  for (int64_t bytes : sweep_sizes(flags.max_bytes)) {
    const at::Tensor payload = payload_of(bytes);
    SweepRow row{bytes, sweep_iterations(flags, bytes), {}};
    samples.clear();
    s = time_calls(warmup_of(row.iterations, 1), row.iterations,
                   [&] { return echo(worker, peer, payload); }, samples);
    if (s = step(absl::StrCat("echo ", bytes, " B").c_str(), s); !s.ok()) return s;
    row.summary = summarize(std::move(samples));
    rows.push_back(row);
  }
  out.number("echo_1MB_GBps", sweep_gbps(rows, int64_t{1} << 20));
  out.number("echo_64MB_GBps", sweep_gbps(rows, int64_t{64} << 20));
  out.raw("sweep", sweep_json(rows));
  return absl::OkStatus();
}

// Both ranks decide alike whether the variant can run here: a backend that
// is not registered or not viable is "n/a", not a failure.
absl::Status variant_available(const BackendRegistry& registry,
                               const std::string& backend) {
  absl::StatusOr<const Backend*> found = registry.find(backend);
  if (!found.ok()) {
    return absl::NotFoundError(absl::StrCat("backend \"", backend,
                                            "\" is not registered in this build"));
  }
  if ((*found)->viable) return (*found)->viable();
  return absl::OkStatus();
}

[[noreturn]] void usage(const std::string& bad);

int run_variant(const Flags& flags, int rank) {
  JsonObject out;
  out.string("variant", flags.label.empty() ? flags.backend : flags.label);
  out.string("backend", flags.backend);
  {
    std::map<std::string, std::string> sorted(flags.settings.begin(),
                                              flags.settings.end());
    JsonObject settings;
    for (const auto& [k, v] : sorted) settings.string(k, v);
    out.raw("settings", settings.str());
  }
  out.raw("quick", flags.quick ? "true" : "false");

  BackendRegistry registry;
  if (absl::Status s = backends::register_builtin_backends(registry); !s.ok()) {
    std::fprintf(stderr, "bench_worker: registry: %s\n", s.ToString().c_str());
    return 1;
  }
  if (absl::Status s = variant_available(registry, flags.backend); !s.ok()) {
    out.string("status", absl::StrCat("n/a: ", s.message()));
    if (rank == 0) print_json(out);
    return 0;
  }
  RpcOptions options;
  options.backend = flags.backend;
  options.backend_settings = flags.settings;
  // "busy_poll_us" and "spare_core_poll_us" are RpcOptions::busy_poll and
  // spare_core_poll, not a backend's settings.
  for (auto [key, field] :
       {std::pair{"busy_poll_us", &RpcOptions::busy_poll},
        std::pair{"spare_core_poll_us", &RpcOptions::spare_core_poll}}) {
    auto it = options.backend_settings.find(key);
    if (it == options.backend_settings.end()) continue;
    int64_t us = 0;
    if (!absl::SimpleAtoi(it->second, &us) || us < 0) {
      usage(absl::StrCat(key, "=", it->second));
    }
    options.*field = absl::Microseconds(us);
    options.backend_settings.erase(it);
  }
  // Rank 1 waits in the graceful shutdown while rank 0 measures.
  options.shutdown_timeout = absl::Minutes(30);
  options.default_timeout = absl::Minutes(5);
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::create(
      absl::StrCat("w", rank), rank, 2, options, registry,
      {rref_extension(), autograd::autograd_extension()});
  if (!worker.ok()) {
    // A provider or transport this machine lacks: not available, not failed.
    const bool absent = worker.status().code() == absl::StatusCode::kFailedPrecondition;
    out.string("status", absl::StrCat(absent ? "n/a: " : "failed: ",
                                      worker.status().ToString()));
    if (rank == 0) print_json(out);
    return absent ? 0 : 1;
  }
  // Whether THP_MEM_ALLOC_ENABLE=1 reached this worker (core/huge_pages.h).
  out.raw("huge_pages", using_huge_pages_for_large_tensors() ? "true" : "false");
  absl::Status measured = absl::OkStatus();
  if (rank == 0) measured = run_workloads(**worker, flags, out);
  absl::Status down = (*worker)->shutdown();
  if (measured.ok() && !down.ok()) {
    measured = absl::Status(down.code(), absl::StrCat("shutdown: ", down.message()));
  }
  out.string("status", measured.ok() ? "ok" : absl::StrCat("failed: ", measured.ToString()));
  if (rank == 0) print_json(out);
  return measured.ok() ? 0 : 1;
}

// ---- raw baselines ----

absl::Status run_raw(const Flags& flags, int rank, JsonObject& out) {
  std::unique_ptr<c10d::TCPStore> store = launcher_store("bench_worker", rank);
  absl::StatusOr<TcpPair> pair = TcpPair::connect(rank, *store, absl::Seconds(30));
  if (!pair.ok()) return pair.status();
  std::vector<SweepRow> rows;
  for (int64_t bytes : sweep_sizes(flags.max_bytes)) {
    // The small size gets as many round trips as rpc_sync gets calls.
    SweepRow row{bytes,
                 bytes == 8 ? static_cast<int>(flags.count("sync_calls"))
                            : sweep_iterations(flags, bytes),
                 {}};
    std::vector<double> samples;
    if (absl::Status s = tcp_ping_pong(*pair, static_cast<size_t>(bytes),
                                       warmup_of(row.iterations, 1),
                                       row.iterations, samples);
        !s.ok()) {
      return s;
    }
    row.summary = summarize(std::move(samples));
    rows.push_back(row);
  }
  absl::StatusOr<double> stream = tcp_stream(
      *pair, static_cast<size_t>(flags.count("stream_bytes")), size_t{1} << 20);
  if (!stream.ok()) return stream.status();
  // TensorPipe's pipe alone over tether's tcp transport, as many round trips
  // as rpc_sync gets calls: a small call through the pipe (tether's go
  // around it, as express frames).
  absl::StatusOr<std::vector<double>> pipe = tensorpipe_pipe_ping_pong(
      "tcp", rank, *store, static_cast<int>(flags.count("sync_calls")));
  if (!pipe.ok()) return pipe.status();
  if (rank != 0) return absl::OkStatus();
  const Summary pipe_alone = summarize(std::move(*pipe));
  out.number("tp_pipe_alone_p50_us", pipe_alone.p50_us);
  out.number("tp_pipe_alone_p99_us", pipe_alone.p99_us);
  if (!rows.empty()) {
    out.number("tcp_pingpong_p50_us", rows.front().summary.p50_us);
    out.number("tcp_pingpong_p99_us", rows.front().summary.p99_us);
  }
  out.number("tcp_echo_1MB_GBps", sweep_gbps(rows, int64_t{1} << 20));
  out.number("tcp_echo_64MB_GBps", sweep_gbps(rows, int64_t{64} << 20));
  out.number("tcp_stream_GBps", *stream);
  const size_t copy_bytes =
      static_cast<size_t>(std::min<int64_t>(flags.max_bytes, int64_t{64} << 20));
  const int copies = static_cast<int>(flags.count("memcpy_iters"));
  out.number("memcpy_GBps", memcpy_gbps(copy_bytes, copies));
  out.number("memcpy_fresh_GBps", memcpy_gbps(copy_bytes, copies, /*fresh=*/true));
  out.number("memcpy_huge_pages_GBps",
             memcpy_gbps(copy_bytes, copies, /*fresh=*/false, /*huge_pages=*/true));
  out.raw("sweep", sweep_json(rows));
  return absl::OkStatus();
}

// ---- the command line ----

[[noreturn]] void usage(const std::string& bad) {
  std::fprintf(stderr,
               "bench_worker: bad argument %s\n"
               "usage: tether_run --nproc 2 -- bench_worker [--backend=NAME] "
               "[--setting=KEY=VALUE]... [--label=TEXT] [--quick] "
               "[--max_bytes=N] [--COUNT=N]...\n"
               "       tether_run --nproc 2 -- bench_worker --raw [--quick] "
               "[--max_bytes=N]\n"
               "       bench_worker --list\n"
               "COUNT: sync_calls async_calls remote_calls autograd_steps "
               "sweep_bytes sweep_min_iters sweep_max_iters stream_bytes "
               "memcpy_iters\n",
               bad.c_str());
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags flags;
  std::map<std::string, int64_t> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::pair<std::string, std::string> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    int64_t n = 0;
    if (arg == "--quick") {
      flags.quick = true;
    } else if (arg == "--raw") {
      flags.raw = true;
    } else if (arg == "--list") {
      flags.list = true;
    } else if (key == "--backend" && !value.empty()) {
      flags.backend = value;
    } else if (key == "--label") {
      flags.label = value;
    } else if (key == "--setting" && value.find('=') != std::string::npos) {
      std::pair<std::string, std::string> setting =
          absl::StrSplit(value, absl::MaxSplits('=', 1));
      flags.settings[setting.first] = setting.second;
    } else if (key == "--max_bytes" && absl::SimpleAtoi(value, &n) && n >= 8) {
      flags.max_bytes = n;
    } else if (key.rfind("--", 0) == 0 && absl::SimpleAtoi(value, &n) && n > 0) {
      overrides[key.substr(2)] = n;
    } else {
      usage(arg);
    }
  }
  for (Count& c : flags.counts) {
    c.value = flags.quick ? c.quick : c.full;
    if (auto it = overrides.find(c.name); it != overrides.end()) {
      c.value = it->second;
      overrides.erase(it);
    }
  }
  if (!overrides.empty()) usage(absl::StrCat("--", overrides.begin()->first));
  return flags;
}

int list_backends() {
  BackendRegistry registry;
  if (absl::Status s = backends::register_builtin_backends(registry); !s.ok()) {
    std::fprintf(stderr, "bench_worker: registry: %s\n", s.ToString().c_str());
    return 1;
  }
  JsonObject backends;
  for (const std::string& name : registry.names()) {
    absl::Status viable = variant_available(registry, name);
    backends.string(name, viable.ok() ? "ok" : std::string(viable.message()));
  }
  JsonObject out;
  out.raw("backends", backends.str());
  print_json(out);
  return 0;
}

int main_impl(int argc, char** argv) {
  const Flags flags = parse(argc, argv);
  if (flags.list) return list_backends();
  const tether::LauncherEnv env = launched("bench_worker");
  const int rank = env.rank;
  if (env.world_size != 2) {
    std::fprintf(stderr, "bench_worker: run with tether_run --nproc 2\n");
    return 2;
  }
  if (!flags.raw) return run_variant(flags, rank);
  JsonObject out;
  out.string("variant", "raw");
  out.raw("quick", flags.quick ? "true" : "false");
  // No tether worker in this mode: the pair meets through the launcher's
  // store.
  absl::Status s = run_raw(flags, rank, out);
  out.string("status", s.ok() ? "ok" : absl::StrCat("failed: ", s.ToString()));
  if (rank == 0) print_json(out);
  if (!s.ok()) {
    std::fprintf(stderr, "bench_worker rank %d: %s\n", rank,
                 s.ToString().c_str());
  }
  return s.ok() ? 0 : 1;
}

}  // namespace
}  // namespace tether::bench

int main(int argc, char** argv) { return tether::bench::main_impl(argc, argv); }
