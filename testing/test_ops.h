// Operators that RPC tests call remotely, registered with TORCH_LIBRARY as
// users register theirs (namespace tether_test). Linking //testing:test_ops
// registers them; tests name them by these constants.
//
// Used by core/worker_test.cc (workers of one process) and the multi-process
// scenarios (testing/scenarios/rpc_scenarios_test.cc).
#ifndef TETHER_TESTING_TEST_OPS_H_
#define TETHER_TESTING_TEST_OPS_H_

#include <ATen/core/ivalue.h>
#include <absl/time/time.h>

namespace tether::testing {

// scale(Tensor x, float factor) -> Tensor: x * factor.
inline constexpr char kScale[] = "tether_test::scale";
// fail(Tensor x) -> Tensor: raises "fail was asked to fail on a tensor of N
// elements".
inline constexpr char kFail[] = "tether_test::fail";
// slow(int millis) -> int: sleeps, then returns millis.
inline constexpr char kSlow[] = "tether_test::slow";
// add_via(str to, Tensor a, Tensor b) -> Tensor: the serving worker calls
// aten::add.Tensor on `to` (a nested call).
inline constexpr char kAddVia[] = "tether_test::add_via";
// slow_then_add_via(str to) -> Tensor: sleeps 300 ms, then add_via(to, 1, 1).
inline constexpr char kSlowThenAddVia[] = "tether_test::slow_then_add_via";
// whoami() -> str: the serving worker's name.
inline constexpr char kWhoami[] = "tether_test::whoami";
// nesting(Any x) -> int: how many lists x nests (0 for a non-list).
inline constexpr char kNesting[] = "tether_test::nesting";
// identity(Tensor x) -> Tensor.
inline constexpr char kIdentity[] = "tether_test::identity";
// chain(int hops) -> int: sends chain(hops - 1) to the next rank without
// waiting, returns hops: a chain that outlives the call that started it.
inline constexpr char kChain[] = "tether_test::chain";
// release() -> int: lets wait_for_release() in this process return.
inline constexpr char kRelease[] = "tether_test::release";

// Waits until some peer called release() here; false after `timeout`.
bool wait_for_release(absl::Duration timeout);

// A list of lists `depth` deep (List[Any] down to a List[int] of one 1),
// for tests of the nesting limit; kNesting of it is `depth`.
c10::IValue nested_lists(int depth);

}  // namespace tether::testing

#endif  // TETHER_TESTING_TEST_OPS_H_
