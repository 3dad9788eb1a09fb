// rpc_latency: small-call round-trip latency between two processes, per
// backend variant, beside a plain TCP ping-pong measured in the same run.
//
//   bazel build -c opt //tools:tether_run //tools:rpc_latency
//   bazel-bin/tools/tether_run --nproc 2 -- bazel-bin/tools/rpc_latency
//       --calls=5000 [--variants=tcp,uv]
//
// Rank 0 times every call (per-call samples, so p50 and p99 are real
// percentiles) of `aten::add.Scalar` on a 2-element float tensor, via
// rpc_sync to rank 1, for each variant in turn: TensorPipe over tether's
// guarded tcp transport (the default), over uv (TCP) only, over shm only,
// and with TensorPipe's own negotiation (all transports and channels); gRPC;
// libfabric over tcp;ofi_rxm and over shm; TensorPipe's pipe alone, over
// tether's tcp transport and over uv, with no tether agent, codec or
// operator (tools/internal/tp_pipe.h: what a small call would cost through
// the pipe, which the tensorpipe backend's small calls go around). With
// --no_tensors the call is a TorchScript `inc(int) -> int` instead (no
// storage travels); with --floats=N the tensor has N floats (a mid-size
// call: N*4 bytes each way); with --echo=BYTES every variant echoes a uint8
// tensor of BYTES through the bench's identity operator instead (the
// bench's echo sweep), the pipe alone carries BYTES of data laid out as the
// backend lays out that call, and the raw ping-pong BYTES. Then a raw TCP
// ping-pong (16-byte messages, TCP_NODELAY) between the same two processes. Prints a table and one JSON line.
// --variants keeps the variants whose labels contain one of its words
// and the raw ping-pong if one names it: --variants=tcp runs the default
// transport alone (under strace -c or perf stat the counts are then that
// variant's), --variants=tcp,raw adds the baseline. --set=KEY=VALUE
// (repeatable) gives every variant of KEY's backend that setting, e.g.
// --set=libfabric.provider=shm. --busy_poll_us=N sets RpcOptions::busy_poll,
// --spare_core_poll_us=N RpcOptions::spare_core_poll (0 under callgrind,
// whose counts polling would make depend on timing).
#include <ATen/ATen.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/builtin.h"
#include "core/worker.h"
#include "tools/internal/launcher_env.h"
#include "tools/internal/raw_baselines.h"
#include "tools/internal/samples.h"
#include "tools/internal/tp_pipe.h"
#include "tools/internal/workloads.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Variant {
  std::string label;
  std::string backend;
  absl::flat_hash_map<std::string, std::string> settings;
};

struct Result {
  std::string label;
  double p50_us = 0;
  double p99_us = 0;
};

Result summarize(const std::string& label, std::vector<double> samples_us) {
  tether::bench::Summary s = tether::bench::summarize(std::move(samples_us));
  return Result{label, s.p50_us, s.p99_us};
}

void die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "rpc_latency: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  std::exit(1);
}

// One variant: both ranks make a group on its own store port; rank 0 times.
absl::StatusOr<Result> run_variant(const Variant& variant, int rank,
                                   int store_port, int calls, bool tensors,
                                   int floats, int64_t echo_bytes,
                                   absl::Duration busy_poll,
                                   std::optional<absl::Duration> spare_core_poll,
                                   const tether::BackendRegistry& registry) {
  tether::RpcOptions options;
  options.backend = variant.backend;
  options.init_method = absl::StrCat("tcp://127.0.0.1:", store_port);
  options.backend_settings = variant.settings;
  options.num_worker_threads = 2;
  options.busy_poll = busy_poll;
  if (spare_core_poll.has_value()) options.spare_core_poll = *spare_core_poll;
  options.scripts = {"def inc(x: int) -> int:\n    return x + 1\n"};
  absl::StatusOr<std::unique_ptr<tether::Worker>> worker = tether::Worker::create(
      absl::StrCat("w", rank), rank, 2, options, registry);
  if (!worker.ok()) return worker.status();
  Result result;
  if (rank == 0) {
    at::Tensor x = at::ones({floats});
    const at::Tensor payload =
        tether::bench::payload_of(echo_bytes > 0 ? echo_bytes : 1);
    std::vector<double> samples;
    samples.reserve(calls);
    const int warmup = std::max(100, calls / 10);
    for (int i = 0; i < warmup + calls; ++i) {
      Clock::time_point start = Clock::now();
      absl::Status y =
          echo_bytes > 0
              ? tether::bench::echo(**worker, tether::To(1), payload)
          : tensors
              ? (*worker)->rpc_sync(1, "aten::add.Scalar", {x, 1.0}).status()
              : (*worker)->rpc_sync(1, "inc", {int64_t{i}}).status();
      double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (!y.ok()) return y;
      if (i >= warmup) samples.push_back(us);
    }
    result = summarize(variant.label, std::move(samples));
  }
  absl::Status down = (*worker)->shutdown();
  if (!down.ok()) return down;
  return result;
}

// A plain TCP ping-pong of `bytes` (tools/internal/raw_baselines.h): rank 1
// echoes, rank 0 times each round trip.
Result tcp_ping_pong(int rank, int calls, size_t bytes,
                     const std::string& label) {
  std::unique_ptr<c10d::TCPStore> store =
      tether::bench::launcher_store("rpc_latency", rank);
  absl::StatusOr<tether::bench::TcpPair> pair =
      tether::bench::TcpPair::connect(rank, *store, absl::Seconds(30));
  if (!pair.ok()) die("TCP baseline", pair.status());
  std::vector<double> samples;
  absl::Status s = tether::bench::tcp_ping_pong(
      *pair, bytes, std::max(100, calls / 10), calls, samples);
  if (!s.ok()) die("TCP baseline", s);
  return summarize(label, std::move(samples));
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 5000;
  bool tensors = true;
  int busy_poll_us = 0;
  std::optional<absl::Duration> spare_core_poll;
  int spare_core_poll_us = 0;
  int floats = 2;
  int64_t echo_bytes = 0;
  std::vector<std::string> only;
  std::vector<std::pair<std::string, std::string>> extra;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--calls=", 0) == 0 && absl::SimpleAtoi(arg.substr(8), &calls) &&
        calls > 0) {
      continue;
    }
    if (arg.rfind("--busy_poll_us=", 0) == 0 &&
        absl::SimpleAtoi(arg.substr(15), &busy_poll_us) && busy_poll_us >= 0) {
      continue;
    }
    if (arg.rfind("--spare_core_poll_us=", 0) == 0 &&
        absl::SimpleAtoi(arg.substr(21), &spare_core_poll_us) &&
        spare_core_poll_us >= 0) {
      spare_core_poll = absl::Microseconds(spare_core_poll_us);
      continue;
    }
    if (arg.rfind("--floats=", 0) == 0 && absl::SimpleAtoi(arg.substr(9), &floats) &&
        floats > 0) {
      continue;
    }
    if (arg.rfind("--echo=", 0) == 0 &&
        absl::SimpleAtoi(arg.substr(7), &echo_bytes) && echo_bytes > 0) {
      continue;
    }
    if (arg == "--no_tensors") {
      tensors = false;
      continue;
    }
    if (arg.rfind("--variants=", 0) == 0) {
      only = absl::StrSplit(arg.substr(11), ',', absl::SkipEmpty());
      continue;
    }
    if (arg.rfind("--set=", 0) == 0 && arg.find('=', 6) != std::string::npos) {
      const size_t eq = arg.find('=', 6);
      extra.emplace_back(arg.substr(6, eq - 6), arg.substr(eq + 1));
      continue;
    }
    std::fprintf(stderr,
                 "usage: rpc_latency [--calls=N] [--no_tensors] [--floats=N] "
                 "[--echo=BYTES] "
                 "[--variants=WORD,...] [--set=KEY=VALUE ...] "
                 "[--busy_poll_us=N] [--spare_core_poll_us=N]\n");
    return 2;
  }
  const tether::LauncherEnv env = tether::bench::launched("rpc_latency");
  const int rank = env.rank;
  const int base_port = tether::bench::master_port("rpc_latency");
  if (env.world_size != 2) {
    std::fprintf(stderr, "rpc_latency: run with --nproc 2\n");
    return 2;
  }
  tether::BackendRegistry registry;
  if (absl::Status s = tether::backends::register_builtin_backends(registry); !s.ok()) {
    die("registry", s);
  }
  std::vector<Variant> variants = {
      {"tensorpipe tcp (tether's)",
       "tensorpipe",
       {{"tensorpipe.transports", "tcp"}, {"tensorpipe.channels", "basic"}}},
      {"tensorpipe uv (TCP)",
       "tensorpipe",
       {{"tensorpipe.transports", "uv"}, {"tensorpipe.channels", "basic"}}},
      {"tensorpipe uv + cma",
       "tensorpipe",
       {{"tensorpipe.transports", "uv"}, {"tensorpipe.channels", "cma"}}},
      {"tensorpipe shm",
       "tensorpipe",
       {{"tensorpipe.transports", "shm"}, {"tensorpipe.channels", "basic"}}},
      {"tensorpipe negotiated", "tensorpipe", {}},
      {"grpc (HTTP/2 over TCP)", "grpc", {}},
      {"libfabric tcp;ofi_rxm",
       "libfabric",
       {{"libfabric.provider", "tcp;ofi_rxm"}}},
      {"libfabric shm", "libfabric", {{"libfabric.provider", "shm"}}},
  };
  // --set: a setting every variant gets (its backend reads its own keys).
  for (Variant& variant : variants) {
    for (const auto& [key, value] : extra) {
      if (absl::StartsWith(key, variant.backend + ".")) {
        variant.settings[key] = value;
      }
    }
  }
  auto wanted = [&only](const std::string& label) {
    return only.empty() ||
           std::any_of(only.begin(), only.end(), [&](const std::string& word) {
             return absl::StrContains(label, word);
           });
  };
  std::vector<Result> results;
  for (size_t v = 0; v < variants.size(); ++v) {
    if (!wanted(variants[v].label)) continue;
    absl::StatusOr<Result> r = run_variant(
        variants[v], rank, base_port + 1 + static_cast<int>(v), calls, tensors,
        floats, echo_bytes, absl::Microseconds(busy_poll_us), spare_core_poll,
        registry);
    if (!r.ok()) die(variants[v].label, r.status());
    results.push_back(*r);
  }
  // TensorPipe's pipe alone, carrying what tether's frame of this call
  // carries (tools/internal/tp_pipe.h).
  for (const std::string transport : {"tcp", "uv"}) {
    const std::string label =
        absl::StrCat("tensorpipe pipe alone (", transport, ")");
    if (!wanted(label)) continue;
    std::unique_ptr<c10d::TCPStore> store =
        tether::bench::launcher_store("rpc_latency", rank);
    absl::StatusOr<std::vector<double>> samples =
        tether::bench::tensorpipe_pipe_ping_pong(
            transport, rank, *store, calls, static_cast<size_t>(echo_bytes));
    if (!samples.ok()) die(label, samples.status());
    if (rank == 0) results.push_back(summarize(label, std::move(*samples)));
  }
  // The raw baseline unless --variants leaves it out (e.g. --variants=raw
  // runs it alone).
  const size_t raw_bytes = echo_bytes > 0 ? static_cast<size_t>(echo_bytes) : 16;
  const std::string raw_label =
      absl::StrCat("raw TCP ping-pong (", raw_bytes, " B)");
  std::optional<Result> tcp;
  if (wanted(raw_label)) tcp = tcp_ping_pong(rank, calls, raw_bytes, raw_label);
  if (rank != 0) return 0;
  if (tcp) results.push_back(*tcp);
  std::printf("rpc_sync(%s) round trip, %d calls each\n",
              echo_bytes > 0
                  ? absl::StrCat("identity, ", echo_bytes, " B").c_str()
              : tensors
                  ? absl::StrCat("aten::add.Scalar, ", floats, " floats").c_str()
                  : "TorchScript inc(int)",
              calls);
  std::printf("%-28s %10s %10s %14s\n", "variant", "p50 us", "p99 us",
              "p50 / raw TCP");
  std::vector<std::string> json;
  for (const Result& r : results) {
    std::printf(
        "%-28s %10.1f %10.1f %14s\n", r.label.c_str(), r.p50_us, r.p99_us,
        tcp ? absl::StrFormat("%.2f", r.p50_us / tcp->p50_us).c_str() : "-");
    json.push_back(absl::StrCat("\"", r.label, "\": {\"p50_us\": ", r.p50_us,
                                ", \"p99_us\": ", r.p99_us, "}"));
  }
  std::printf("JSON {%s}\n", absl::StrJoin(json, ", ").c_str());
  return 0;
}
