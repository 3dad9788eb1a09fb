// Per-call samples and their percentiles, for the benchmark tools
// (tools/bench_worker.cc, tools/rpc_latency.cc) and the Google Benchmark
// suites in bench/.
//
// Every workload is timed call by call, so p50 and p99 are real percentiles
// of the calls, not of averages over batches.
#ifndef TETHER_TOOLS_INTERNAL_SAMPLES_H_
#define TETHER_TOOLS_INTERNAL_SAMPLES_H_

#include <absl/status/status.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace tether::bench {

using Clock = std::chrono::steady_clock;

inline double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start)
      .count();
}

struct Summary {
  int64_t count = 0;
  double p50_us = 0;
  double p99_us = 0;
  double min_us = 0;
};

// The nearest-rank percentiles of `samples_us` (any order); zeros if empty.
inline Summary summarize(std::vector<double> samples_us) {
  Summary s;
  if (samples_us.empty()) return s;
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  s.count = static_cast<int64_t>(n);
  s.p50_us = samples_us[n / 2];
  s.p99_us = samples_us[std::min(n - 1, n * 99 / 100)];
  s.min_us = samples_us.front();
  return s;
}

// Runs `call` (returning absl::Status) `warmup` times untimed, then
// `iterations` times timed one by one; stops at the first error.
template <typename Call>
absl::Status time_calls(int warmup, int iterations, Call call,
                        std::vector<double>& samples_us) {
  for (int i = 0; i < warmup; ++i) {
    if (absl::Status s = call(); !s.ok()) return s;
  }
  samples_us.reserve(samples_us.size() + static_cast<size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    const Clock::time_point start = Clock::now();
    absl::Status s = call();
    const double us = micros_since(start);
    if (!s.ok()) return s;
    samples_us.push_back(us);
  }
  return absl::OkStatus();
}

// Like time_calls for two calls run alternately (a, b, a, b, ...), so that
// both are measured under the same conditions of a noisy machine.
template <typename CallA, typename CallB>
absl::Status time_alternating(int warmup, int iterations, CallA call_a,
                              CallB call_b, std::vector<double>& samples_a,
                              std::vector<double>& samples_b) {
  for (int i = 0; i < warmup + iterations; ++i) {
    Clock::time_point start = Clock::now();
    absl::Status s = call_a();
    const double a_us = micros_since(start);
    if (!s.ok()) return s;
    start = Clock::now();
    s = call_b();
    const double b_us = micros_since(start);
    if (!s.ok()) return s;
    if (i < warmup) continue;
    samples_a.push_back(a_us);
    samples_b.push_back(b_us);
  }
  return absl::OkStatus();
}

// GB/s (1e9 bytes per second) of `bytes` moved in `us` microseconds.
inline double gbps(double bytes, double us) {
  return us > 0 ? bytes / (us * 1e3) : 0;
}

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_SAMPLES_H_
