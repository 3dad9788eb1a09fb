// Google Benchmark suite of the RPC layer: rpc_sync of the bench's small
// call, 64 calls in flight, and the echo of a tensor by size, between two
// workers of this process on loopback (threads only) and on TensorPipe
// (real transports). Per-call p50/p99 are counters.
//
//   bazel run -c opt //bench:rpc_benchmark
#include "bench/layer_bench.h"
#include "tools/internal/workloads.h"

namespace tether::bench {
namespace {

void BM_RpcSync(benchmark::State& state, const char* backend) {
  Worker* a = worker_a(state, backend);
  if (a == nullptr) return;
  const at::Tensor x = small_tensor();
  timed_loop(state, [&] { return add_sync(*a, "b", x); });
}

// One iteration: 256 calls, at most 64 in flight.
void BM_RpcAsync64(benchmark::State& state, const char* backend) {
  Worker* a = worker_a(state, backend);
  if (a == nullptr) return;
  const at::Tensor x = small_tensor();
  constexpr int kCalls = 256;
  timed_loop(state,
             [&] { return add_async_window(*a, "b", x, kCalls, kAsyncWindow); });
  state.counters["calls_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kCalls),
      benchmark::Counter::kIsRate);
}

void BM_Echo(benchmark::State& state, const char* backend) {
  Worker* a = worker_a(state, backend);
  if (a == nullptr) return;
  const at::Tensor payload = payload_of(state.range(0));
  timed_loop(state, [&] { return echo(*a, "b", payload); });
  // Both ways.
  state.SetBytesProcessed(state.iterations() * 2 * state.range(0));
}

BENCHMARK_CAPTURE(BM_RpcSync, loopback, "loopback")->UseManualTime();
BENCHMARK_CAPTURE(BM_RpcSync, tensorpipe, "tensorpipe")->UseManualTime();
BENCHMARK_CAPTURE(BM_RpcAsync64, loopback, "loopback")->UseManualTime();
BENCHMARK_CAPTURE(BM_RpcAsync64, tensorpipe, "tensorpipe")->UseManualTime();
BENCHMARK_CAPTURE(BM_Echo, loopback, "loopback")
    ->Arg(8)->Arg(1 << 20)->Arg(16 << 20)->UseManualTime();
BENCHMARK_CAPTURE(BM_Echo, tensorpipe, "tensorpipe")
    ->Arg(8)->Arg(1 << 20)->Arg(16 << 20)->UseManualTime();

}  // namespace
}  // namespace tether::bench
