// Google Benchmark suite of distributed autograd: the bench's step (in a
// context: a remote Linear(256, 256)'s forward through its RRef proxy on a
// 64 x 256 input requiring grad, backward, get_gradients, release), and a
// context entered and released alone, between two workers of this process
// (loopback, TensorPipe). Per-call p50/p99 are counters.
//
//   bazel run -c opt //bench:autograd_benchmark
#include "autograd/autograd.h"
#include "bench/layer_bench.h"
#include "tools/internal/workloads.h"

namespace tether::bench {
namespace {

void BM_AutogradStep(benchmark::State& state, const char* backend) {
  Worker* a = worker_a(state, backend);
  if (a == nullptr) return;
  absl::StatusOr<RRef> linear = make_linear(*a, "b");
  if (!linear.ok()) return state.SkipWithError(linear.status().ToString().c_str());
  const at::Tensor input = linear_input();
  timed_loop(state, [&] { return autograd_step(*a, *linear, input); });
}

// A context that no message used: entering and releasing it.
void BM_ContextOnly(benchmark::State& state, const char* backend) {
  Worker* a = worker_a(state, backend);
  if (a == nullptr) return;
  timed_loop(state, [&] { return autograd::Context::enter(*a).status(); });
}

BENCHMARK_CAPTURE(BM_AutogradStep, loopback, "loopback")->UseManualTime();
BENCHMARK_CAPTURE(BM_AutogradStep, tensorpipe, "tensorpipe")->UseManualTime();
BENCHMARK_CAPTURE(BM_ContextOnly, loopback, "loopback")->UseManualTime();

}  // namespace
}  // namespace tether::bench
