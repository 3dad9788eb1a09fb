// What the two-process raw-baseline tools (tools/fabric_pingpong.cc,
// tools/grpc_pingpong.cc) share: their common flags, the message sizes and
// rounds of the ping-pong sweep, and its table and JSON rows, in the form
// tools/bench.py reads (from_sweep).
#ifndef TETHER_TOOLS_INTERNAL_PINGPONG_H_
#define TETHER_TOOLS_INTERNAL_PINGPONG_H_

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/internal/samples.h"

namespace tether::bench {

// --iterations=N (at least 10; a tenth more are a warm-up), --quick (at
// most 300), --max_bytes=N (at least 8): what tools/bench.py passes.
struct PingPongFlags {
  int iterations = 2000;
  bool quick = false;
  int64_t max_bytes = int64_t{64} << 20;

  // Whether `arg` is one of these flags, well formed.
  bool parse(const std::string& arg) {
    if (arg == "--quick") {
      quick = true;
      return true;
    }
    if (arg.rfind("--iterations=", 0) == 0) {
      return absl::SimpleAtoi(arg.substr(13), &iterations) && iterations >= 10;
    }
    if (arg.rfind("--max_bytes=", 0) == 0) {
      return absl::SimpleAtoi(arg.substr(12), &max_bytes) && max_bytes >= 8;
    }
    return false;
  }
  static constexpr char kUsage[] =
      "[--iterations=N>=10] [--quick] [--max_bytes=N>=8]";

  int rounds() const { return quick ? std::min(iterations, 300) : iterations; }
  // The sweep's sizes, up to max_bytes: 8 B; every size of the bench's
  // mid-size echo (1, 4, 16, 64 and 256 KiB and 1 MiB: bench_worker's
  // powers of 4), so the echo is compared with these at the same size;
  // 8 KiB; 16 and 64 MiB.
  std::vector<size_t> sizes() const {
    std::vector<size_t> out;
    for (size_t size :
         {size_t{8}, size_t{1} << 10, size_t{4} << 10, size_t{8} << 10,
          size_t{16} << 10, size_t{64} << 10, size_t{256} << 10,
          size_t{1} << 20, size_t{16} << 20, size_t{64} << 20}) {
      if (size <= static_cast<uint64_t>(max_bytes)) out.push_back(size);
    }
    return out;
  }
  // Timed round trips of `size` bytes: fewer of the larger sizes.
  int rounds_of(size_t size) const {
    const int all = rounds();
    return size >= (size_t{16} << 20)  ? std::max(10, all / 100)
           : size >= (size_t{64} << 10) ? all / 4
                                        : all;
  }
};

struct Latency {
  size_t size = 0;
  Summary summary;
};

// Times `round_trip()` (void) `rounds` times after a tenth as many untimed.
template <typename RoundTrip>
Latency time_round_trips(size_t size, int rounds, RoundTrip round_trip) {
  std::vector<double> samples;
  (void)time_calls(rounds / 10, rounds,
                   [&] {
                     round_trip();
                     return absl::OkStatus();
                   },
                   samples);
  return Latency{size, summarize(std::move(samples))};
}

// Prints the table of round trips, p50 and p99.
inline void print_latencies(const std::vector<Latency>& latencies) {
  std::printf("%-24s %12s %12s\n", "ping-pong round trip", "p50 us", "p99 us");
  for (const Latency& l : latencies) {
    std::printf("%-24s %12.1f %12.1f\n", absl::StrCat(l.size, " B").c_str(),
                l.summary.p50_us, l.summary.p99_us);
  }
}

// `"p50_us": <smallest size's>, "sweep": [{"bytes": B, "p50_us": T,
// "GBps": G}, ...]`, GB/s counting both directions.
inline std::string sweep_json(const std::vector<Latency>& latencies) {
  std::vector<std::string> rows;
  for (const Latency& l : latencies) {
    rows.push_back(absl::StrCat(
        "{\"bytes\": ", l.size, ", \"p50_us\": ", l.summary.p50_us,
        ", \"GBps\": ",
        2.0 * static_cast<double>(l.size) / (l.summary.p50_us * 1e3), "}"));
  }
  return absl::StrCat(
      "\"p50_us\": ", latencies.empty() ? 0.0 : latencies.front().summary.p50_us,
      ", \"sweep\": [", absl::StrJoin(rows, ", "), "]");
}

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_PINGPONG_H_
