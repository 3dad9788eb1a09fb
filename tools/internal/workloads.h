// The bench's workloads, one call each, on a Worker: what the bench
// worker (tools/bench_worker.cc, two processes) times per call, and what the
// Google Benchmark suites in bench/ (workers of one process) time too, so
// both measure the same thing.
//
// Linking //tools/internal:workloads registers the operators they call
// (TORCH_LIBRARY tether_bench): identity(Tensor x) -> Tensor,
// cpu_seconds() -> float (the callee's CPU time, process_cpu_seconds) and the module
// class __torch__.torch.classes.tether_bench.Linear(int in, int out, int
// seed) with forward(Tensor x) -> Tensor (x W^T + b, W and b requiring
// grad). Every worker of a group must link them.
//
// Thread safety: every function may be called from any thread.
#ifndef TETHER_TOOLS_INTERNAL_WORKLOADS_H_
#define TETHER_TOOLS_INTERNAL_WORKLOADS_H_

#include <ATen/core/Tensor.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <utility>

#include "core/worker.h"
#include "rref/rref.h"

namespace tether::bench {

inline constexpr char kIdentity[] = "tether_bench::identity";
inline constexpr char kLinear[] = "__torch__.torch.classes.tether_bench.Linear";
// The step's shapes: Linear(256, 256) on a 64 x 256 input.
inline constexpr int64_t kLinearFeatures = 256;
inline constexpr int64_t kLinearBatch = 64;
// Calls in flight in the async workload.
inline constexpr int kAsyncWindow = 64;

// The small call: a 2-element float tensor.
at::Tensor small_tensor();

// rpc_sync of aten::add.Scalar(small tensor, 1.0) on `to`.
[[nodiscard]] absl::Status add_sync(Worker& worker, const To& to,
                                    const at::Tensor& x);

// `calls` of the same call through rpc_async, at most `window` in flight
// (a new one starts as soon as the oldest completes).
[[nodiscard]] absl::Status add_async_window(Worker& worker, const To& to,
                                            const at::Tensor& x, int calls,
                                            int window);

// remote() of the same call on `to`, then to_here().
[[nodiscard]] absl::Status add_remote_to_here(Worker& worker, const To& to,
                                              const at::Tensor& x);

// `payload` sent to `to`'s identity operator and back (its size checked).
[[nodiscard]] absl::Status echo(Worker& worker, const To& to,
                                const at::Tensor& payload);

// The CPU time this process has used, user and system, all its threads
// (CLOCK_PROCESS_CPUTIME_ID), in seconds.
double process_cpu_seconds();

// process_cpu_seconds() of the process of `to`, by one rpc_sync.
[[nodiscard]] absl::StatusOr<double> cpu_seconds_of(Worker& worker,
                                                    const To& to);

// CPU used, both ends together, over a stretch of the bench: read
// `start()` before, `seconds()` after (both ask `to` by one call, which
// stays outside the stretch on this side and at its edge on the other).
class CpuUse {
 public:
  CpuUse(Worker& worker, const To& to) : worker_(worker), to_(to) {}
  [[nodiscard]] absl::Status start();
  // CPU seconds since start(): {this process, the process of `to`}.
  [[nodiscard]] absl::StatusOr<std::pair<double, double>> seconds();

 private:
  Worker& worker_;
  To to_;
  double self_ = 0;
  double peer_ = 0;
};

// A uint8 tensor of `bytes` elements.
at::Tensor payload_of(int64_t bytes);

// A Linear(256, 256) on `to`, held by an RRef (the worker serves RRefs).
[[nodiscard]] absl::StatusOr<RRef> make_linear(Worker& worker, const To& to);

// A 64 x 256 input that requires grad.
at::Tensor linear_input();

// One distributed autograd step: in a new context, `linear`'s forward on
// `input` through its RRef proxy, backward of the sum, get_gradients (which
// must hold `input`'s gradient), then the context's release.
[[nodiscard]] absl::Status autograd_step(Worker& worker, const RRef& linear,
                                         const at::Tensor& input);

// The same Linear(256, 256) in this process with plain LibTorch, no RPC:
// forward, backward of the sum. The compute floor of autograd_step.
class LocalLinear {
 public:
  LocalLinear();
  // One forward and backward on `input` (its .grad accumulates).
  void step(const at::Tensor& input);

 private:
  at::Tensor weight_;
  at::Tensor bias_;
};

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_WORKLOADS_H_
