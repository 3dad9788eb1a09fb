// Google Benchmark suite of the RRef layer: remote() then to_here() of the
// bench's small call, and a method call on a remote module through an
// RRef proxy, between two workers of this process (loopback, TensorPipe).
// Per-call p50/p99 are counters.
//
//   bazel run -c opt //bench:rref_benchmark
#include <ATen/ATen.h>

#include "bench/layer_bench.h"
#include "rref/rref.h"
#include "tools/internal/workloads.h"

namespace tether::bench {
namespace {

void BM_RemoteToHere(benchmark::State& state, const char* backend) {
  Worker* a = worker_a(state, backend);
  if (a == nullptr) return;
  const at::Tensor x = small_tensor();
  timed_loop(state, [&] { return add_remote_to_here(*a, "b", x); });
}

// Linear(256, 256)'s forward on b, through the proxy, without autograd.
void BM_ProxyForward(benchmark::State& state, const char* backend) {
  Worker* a = worker_a(state, backend);
  if (a == nullptr) return;
  absl::StatusOr<RRef> linear = make_linear(*a, "b");
  if (!linear.ok()) return state.SkipWithError(linear.status().ToString().c_str());
  const at::Tensor input = linear_input().detach();
  timed_loop(state, [&] {
    return linear->rpc_sync().call("forward", {input}).status();
  });
}

BENCHMARK_CAPTURE(BM_RemoteToHere, loopback, "loopback")->UseManualTime();
BENCHMARK_CAPTURE(BM_RemoteToHere, tensorpipe, "tensorpipe")->UseManualTime();
BENCHMARK_CAPTURE(BM_ProxyForward, loopback, "loopback")->UseManualTime();
BENCHMARK_CAPTURE(BM_ProxyForward, tensorpipe, "tensorpipe")->UseManualTime();

}  // namespace
}  // namespace tether::bench
