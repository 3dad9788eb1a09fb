// StoreJoin: the graceful-drain barrier behind Agent::join() of every
// multi-process backend.
//
// Used by backends (tensorpipe, grpc, libfabric) whose workers share nothing
// but the group's c10d::Store (AgentSetup::store). The protocol runs in
// rounds, like the peer's agent join:
//
//   1. wait until this worker has no outgoing request pending (the agent's
//      `wait_outgoing_drained` hook), bounded by the deadline;
//   2. a barrier of all workers over the store (a counter key per round);
//   3. every worker adds its `active_count` (outgoing pending + incoming
//      being handled) to a per-round sum and waits until all have added;
//   4. if the sum is 0, every worker returns OK in the same round (rank 0,
//      whose process usually hosts the store, only once every worker has
//      read the sum); otherwise all go on to the next round.
//
// Every worker reads the same final sum, so all leave in the same round and
// their round counters stay in step across repeated join() calls. Keys live
// under "tether/join/<scope>/<round>/". The agent keeps serving requests
// while join() blocks; that is what lets the counts reach 0.
//
// Waiting is bounded by liveness, not by a guess: a worker that is alive
// and still working may keep the others waiting as long as its work lasts
// (the overall `timeout` is off unless the user sets one). While it waits,
// a worker asks every worker that has not arrived yet whether it is alive
// (DrainHooks::check_alive, every `probe_interval`); a lost one ends the
// join at once with UNAVAILABLE naming it, and the reason is published in
// the store ("tether/join/<scope>/failed") so that every waiting worker
// ends with it too: the finder also adds a large mark to the round's phase
// counters, which every waiter looks at anyway, so one store request per
// look tells a waiter both whether all have arrived and whether the join
// failed. When the store itself fails, the worker asks rank 0 (whose
// process serves it for env:// and tcp://) and names it if it is lost.
//
// Ownership: holds a reference to the store; the hooks are borrowed for the
// duration of join().
//
// Thread safety: join() may be called from any thread; concurrent calls on
// one StoreJoin run one after the other. join() blocks: never call it from
// an agent's event thread.
#ifndef TETHER_CORE_JOIN_STORE_JOIN_H_
#define TETHER_CORE_JOIN_STORE_JOIN_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
}  // namespace c10d

namespace tether::join {

// What the barrier needs to know about the local agent's traffic.
struct DrainHooks {
  // Blocks until this agent has no outgoing request pending, or until
  // `deadline`; returns true if drained. Must not block past `deadline`.
  std::function<bool(absl::Time deadline)> wait_outgoing_drained;
  // Outgoing requests pending plus incoming requests being handled, now.
  std::function<int64_t()> active_count;
  // Whether the workers of `ranks` are alive: OK if each answered, else
  // the error of the first that did not (UNAVAILABLE naming it for a lost
  // one). Blocks at most the peer timeout. Unset: no liveness checks.
  std::function<absl::Status(const std::vector<int>& ranks)> check_alive;
  // Called once, when every worker of the group has arrived at the first
  // round (each has called join()), before the group drains: what it sends
  // is drained too. Unset: nothing.
  std::function<void()> all_arrived;
};

class StoreJoin {
 public:
  // `scope` separates independent users of one store (e.g. the backend's
  // name); `rank` in [0, world_size).
  StoreJoin(std::shared_ptr<c10d::Store> store, std::string scope, int rank,
            int world_size,
            absl::Duration probe_interval = absl::Seconds(1));
  ~StoreJoin();
  StoreJoin(const StoreJoin&) = delete;
  StoreJoin& operator=(const StoreJoin&) = delete;

  // Runs the rounds until the group's sum of active counts is 0. Errors:
  // UNAVAILABLE naming a worker found lost (by this worker or another), or
  // when the store fails (naming rank 0 if it is lost); DEADLINE_EXCEEDED
  // when `timeout` (InfiniteDuration: none) passes first, naming the round
  // and the workers that had not arrived. After an error this worker's
  // rounds are out of step with the group: shut down rather than join again.
  [[nodiscard]] absl::Status join(const DrainHooks& hooks,
                                  absl::Duration timeout);

 private:
  const std::shared_ptr<c10d::Store> store_;
  const std::string scope_;
  const int rank_;
  const int world_size_;
  const absl::Duration probe_interval_;
  absl::Mutex mu_;  // held for a whole join(): calls run one at a time
  int64_t next_round_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tether::join

#endif  // TETHER_CORE_JOIN_STORE_JOIN_H_
