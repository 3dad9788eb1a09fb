// Membership: the store side of a dynamic group, one whose workers join and
// leave while it runs (init_rpc without a world size, as the peer's
// TensorPipe agent allows).
//
// Used by the Worker (core/worker.cc) when it joins or leaves a dynamic
// group. Joins and leaves run one at a time, each under the group's
// membership token, as the peer's `_group_membership_management` does; the
// token's holder reads and rewrites the member list, claims or frees its
// name and rank, and tells every member (by messages the Worker sends, not
// here) before it lets go.
//
// Store keys (under the group's store, next to the rendezvous keys):
//   tether/world_size        "dynamic" (put there by the rendezvous,
//                            core/rendezvous.cc; a static group's first rank
//                            puts its world size there: the two cannot mix)
//   tether/members           the members, "rank:name" per line, rank order
//   tether/members/token     "" or the holder: "rank:name:join|leave:nonce"
//   tether/members/beat      a counter the holder adds to every 100 ms
//   tether/name/<name>, tether/rank/<rank>   claims, as in a static group
//
// Waiting is bounded by liveness, not by a guess: a worker waits for the
// token as long as its holder's heartbeat moves (a join or a leave may take
// as long as its work does); a holder whose heartbeat stays still for the
// peer timeout is lost (a killed joiner): the waiter takes the token over,
// removes the lost holder from the member list and frees its name and rank.
//
// Thread safety: a MembershipToken is used by the thread that acquired it;
// its heartbeat runs on a thread of its own.
#ifndef TETHER_CORE_JOIN_MEMBERSHIP_H_
#define TETHER_CORE_JOIN_MEMBERSHIP_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/notification.h>
#include <absl/time/time.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/agent.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tether::join {

// Parses a member list ("rank:name" lines); INVALID_ARGUMENT naming the
// line that is not one.
[[nodiscard]] absl::StatusOr<std::vector<WorkerInfo>> parse_members(
    absl::string_view text);
std::string format_members(const std::vector<WorkerInfo>& members);

class MembershipToken {
 public:
  enum class Op { kJoin, kLeave };

  // Takes the group's token for `self` to join or leave. Errors:
  // DEADLINE_EXCEEDED naming the holder when `deadline` passes first,
  // UNAVAILABLE when the store fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MembershipToken>>
  acquire(std::shared_ptr<c10d::Store> store, const WorkerInfo& self, Op op,
          absl::Duration peer_timeout, absl::Time deadline,
          absl::Duration beat_interval = absl::Milliseconds(100));

  // Releases the token (if it is still this worker's) and stops the
  // heartbeat.
  ~MembershipToken();
  MembershipToken(const MembershipToken&) = delete;
  MembershipToken& operator=(const MembershipToken&) = delete;

  // The members, rank order. UNAVAILABLE if the store fails.
  [[nodiscard]] absl::StatusOr<std::vector<WorkerInfo>> members() const;
  [[nodiscard]] absl::Status set_members(
      const std::vector<WorkerInfo>& members);

  // Claims self's name and rank: ALREADY_EXISTS naming the holder when
  // another worker has either.
  [[nodiscard]] absl::Status claim();
  // Frees `who`'s name and rank (those that still name it) and removes it
  // from the member list.
  [[nodiscard]] absl::Status forget(const WorkerInfo& who);

  // The holder this token was taken over from, if it was lost.
  const std::optional<WorkerInfo>& lost_holder() const { return lost_; }

 private:
  MembershipToken(std::shared_ptr<c10d::Store> store, WorkerInfo self,
                  std::string value, absl::Duration beat_interval);

  const std::shared_ptr<c10d::Store> store_;
  const WorkerInfo self_;
  const std::string value_;
  std::optional<WorkerInfo> lost_;
  absl::Notification stop_;
  std::thread beat_;
};

}  // namespace tether::join

#endif  // TETHER_CORE_JOIN_MEMBERSHIP_H_
