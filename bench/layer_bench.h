// What the RPC, RRef and autograd suites of bench/ share: two workers of
// one process on a backend, kept for the whole run, and a timing loop that
// keeps per-call samples, so each benchmark reports real percentiles
// (counters p50_us and p99_us) beside Google Benchmark's mean.
//
// The workloads themselves are the ones the two-process bench worker
// times (tools/internal/workloads.h), so the suites and the bench CLI
// measure the same calls.
#ifndef TETHER_BENCH_LAYER_BENCH_H_
#define TETHER_BENCH_LAYER_BENCH_H_

#include <absl/status/status.h>
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "core/worker.h"
#include "tools/internal/samples.h"

namespace tether::bench {

// Workers "a" (rank 0) and "b" (rank 1) on `backend` ("loopback" or
// "tensorpipe", negotiated), serving RRefs and distributed autograd; made
// on first use and kept until the process exits. Returns "a", or null
// after skipping `state` with an error if they could not start.
Worker* worker_a(benchmark::State& state, const std::string& backend);

// Runs `call` once per iteration, timing it (manual time: register the
// benchmark with ->UseManualTime()); stops with the call's error. Sets the
// counters p50_us and p99_us of the calls.
template <typename Call>
void timed_loop(benchmark::State& state, Call call) {
  std::vector<double> samples;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    absl::Status s = call();
    const double us = micros_since(start);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    state.SetIterationTime(us * 1e-6);
    samples.push_back(us);
  }
  const Summary summary = summarize(std::move(samples));
  state.counters["p50_us"] = summary.p50_us;
  state.counters["p99_us"] = summary.p99_us;
}

}  // namespace tether::bench

#endif  // TETHER_BENCH_LAYER_BENCH_H_
