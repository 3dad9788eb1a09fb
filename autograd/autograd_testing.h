// Helpers for tests of distributed autograd: operators whose backward runs
// across workers (and fails or stalls on demand), a module class to drive
// through RRef proxies, and the start of a group that serves RRefs and
// autograd.
//
// Used by autograd/autograd_test.cc (workers of one process) and the
// multi-process scenarios (testing/scenarios/autograd_scenarios_test.cc).
// Linking this library registers the operators (TORCH_LIBRARY
// tether_autograd_testing) and the class
// __torch__.torch.classes.tether_autograd_testing.Linear.
#ifndef TETHER_AUTOGRAD_AUTOGRAD_TESTING_H_
#define TETHER_AUTOGRAD_AUTOGRAD_TESTING_H_

#include <memory>
#include <string>
#include <vector>

#include "core/worker.h"

namespace tether::testing {

// fail_backward(Tensor x) -> Tensor: x * 1 forward; its backward throws
// "injected failure in backward".
inline constexpr char kFailBackward[] = "tether_autograd_testing::fail_backward";
// slow_backward(Tensor x, int ms) -> Tensor: x * 1; backward sleeps ms first.
inline constexpr char kSlowBackward[] = "tether_autograd_testing::slow_backward";
// two_outputs(Tensor a, Tensor b) -> (Tensor, Tensor): (a * b, sin(a)).
inline constexpr char kTwoOutputs[] = "tether_autograd_testing::two_outputs";
// mul_via(str to, Tensor a, Tensor b) -> Tensor: rpc_sync(to,
// aten::mul(a * 2, b)) + a, a nested call in the caller's context.
inline constexpr char kMulVia[] = "tether_autograd_testing::mul_via";
// live_contexts() -> int: autograd::live_contexts of the callee.
inline constexpr char kLiveContexts[] = "tether_autograd_testing::live_contexts";
// Linear(int in, int out, int seed): y = x W^T + b with W, b drawn from
// seed. Methods: forward(Tensor x) -> Tensor; parameters() -> Tensor[]
// (detached copies of W, b); grads(int context) -> Tensor[] (their
// gradients in that context on the owner, zeros for none).
inline constexpr char kLinear[] =
    "__torch__.torch.classes.tether_autograd_testing.Linear";

// Workers of one group in this process, one per name (ranks in order),
// built concurrently and serving RRefs and distributed autograd. On error a
// test failure, and the slot stays null.
std::vector<std::unique_ptr<Worker>> start_autograd_workers(
    const BackendRegistry& registry, const RpcOptions& options,
    const std::vector<std::string>& names);

}  // namespace tether::testing

#endif  // TETHER_AUTOGRAD_AUTOGRAD_TESTING_H_
