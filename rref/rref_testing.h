// Helpers for tests of the RRef layer: operators that tests call remotely to
// pass RRefs around and read them, and the bounded wait for a worker's RRef
// counts to come back to zero.
//
// Used by the fault tests (rref/rref_fault_test.cc, workers of one process)
// and the multi-process scenarios (testing/scenarios/rref_scenarios_test.cc).
// The operators are registered (TORCH_LIBRARY tether_rref_testing) by linking
// this library; every wait inside them is bounded by kRRefOpTimeout, not by
// the worker's default timeout (fault tests make that one short).
#ifndef TETHER_RREF_RREF_TESTING_H_
#define TETHER_RREF_RREF_TESTING_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rref/rref.h"

namespace tether::testing {

// How long the operators below wait for a call or a value.
inline constexpr absl::Duration kRRefOpTimeout = absl::Seconds(60);

// The operators, by qualified name. Arguments and results that are RRefs
// are schema type Any.
// value_of(Any r) -> Tensor: r.to_here().
inline constexpr char kValueOf[] = "tether_rref_testing::value_of";
// is_confirmed(Any r) -> bool: r.confirmed_by_owner() in the callee.
inline constexpr char kIsConfirmed[] = "tether_rref_testing::is_confirmed";
// forward(Any r, str[] path) -> Tensor: passes r to path[0] with the rest of
// the path, and so on; the last worker reads it (value_of).
inline constexpr char kForward[] = "tether_rref_testing::forward";
// forward_default(Any r, str[] path) -> Tensor: forward, but every call and
// the fetch keep the callee's default timeout (RpcOptions::default_timeout).
inline constexpr char kForwardDefault[] =
    "tether_rref_testing::forward_default";
// make_local(Tensor t) -> Any: an RRef owned by the callee, holding t * 10.
inline constexpr char kMakeLocal[] = "tether_rref_testing::make_local";
// remote_add(str owner, Tensor x) -> Any: the callee's own user of an RRef
// owned by `owner`, holding x + 1.
inline constexpr char kRemoteAdd[] = "tether_rref_testing::remote_add";
// sum_all(Any rrefs) -> Tensor: the sum of the values of a list of RRefs.
inline constexpr char kSumAll[] = "tether_rref_testing::sum_all";
// debug_counts() -> int[]: the callee's RRefDebugInfo (owners, forks,
// pending users, pending children).
inline constexpr char kDebugCounts[] = "tether_rref_testing::debug_counts";

// Workers of one group in this process, one per name (ranks in order), built
// concurrently from `registry` with `options` and serving RRefs (plus the
// `more` extensions). On error a test failure, and the slots of the workers
// that failed stay null.
std::vector<std::unique_ptr<Worker>> start_workers(
    const BackendRegistry& registry, const RpcOptions& options,
    const std::vector<std::string>& names,
    const RRefOptions& rref_options = RRefOptions(),
    const std::vector<ExtensionFactory>& more = {});

// Shuts every (non-null) worker down gracefully and concurrently, expecting
// success.
void shutdown_workers(std::vector<std::unique_ptr<Worker>>& workers);

// `worker`'s counts, read through debug_counts() from `from`.
[[nodiscard]] absl::StatusOr<RRefDebugInfo> remote_debug_info(
    Worker& from, const std::string& worker);

bool all_released(const RRefDebugInfo& info);

// Polls `read` (every few ms) until every count is zero; a test failure,
// naming `who` and its counts, if they are not by `deadline`.
void expect_released_by(
    absl::string_view who,
    const std::function<absl::StatusOr<RRefDebugInfo>()>& read,
    absl::Time deadline);

}  // namespace tether::testing

#endif  // TETHER_RREF_RREF_TESTING_H_
