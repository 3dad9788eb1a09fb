// PeerTable: the workers a multi-process agent can send to, with the
// address of each, by rank and by name; and how their addresses travel
// through the rendezvous store.
//
// Used by backends/tensorpipe, backends/grpc and backends/libfabric. A
// static group's table is filled once, at init, from exchange_addresses();
// a dynamic group's (AgentSetup::dynamic) starts with the members present
// when the worker joined and changes through Agent::add_peer and
// remove_peer, which each backend implements with add_peer() and remove()
// below plus what it keeps per connection.
//
// Thread safety: every method may be called from any thread.
#ifndef TETHER_BACKENDS_COMMON_PEER_TABLE_H_
#define TETHER_BACKENDS_COMMON_PEER_TABLE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/agent.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tether::backends::common {

struct Peer {
  WorkerInfo info;
  // What the backend connects to, in its own format ("" if none: e.g. a
  // tensorpipe peer that shares no transport with this worker).
  std::string address;
};

class PeerTable {
 public:
  // `workers` with no address yet.
  explicit PeerTable(const std::vector<WorkerInfo>& workers);

  std::optional<Peer> by_name(absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Peer> by_rank(int rank) const ABSL_LOCKS_EXCLUDED(mu_);
  // The peer's name, or "rank N" if it is not (or no longer) known: for
  // error messages.
  std::string name_of(int rank) const ABSL_LOCKS_EXCLUDED(mu_);

  // Sets a known peer's address.
  void set_address(int rank, std::string address) ABSL_LOCKS_EXCLUDED(mu_);

  // Adds `peer` (again: a peer that is already known is OK). ALREADY_EXISTS
  // if another peer has its name or rank.
  [[nodiscard]] absl::Status add(Peer peer) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `info` if it is known (name and rank); true if it was.
  bool remove(const WorkerInfo& info) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Peer> by_rank_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> rank_by_name_ ABSL_GUARDED_BY(mu_);
};

// Publishes `mine` under "<key_prefix><rank>" without waiting for anyone
// (a dynamic group's agent, at init: it tells the members of itself only
// after this). UNAVAILABLE if the store fails; `who` opens the message.
[[nodiscard]] absl::Status publish_address(c10d::Store& store,
                                           absl::string_view key_prefix,
                                           int rank, absl::string_view mine,
                                           absl::string_view who);

// The address `peer` published under "<key_prefix><rank>". UNAVAILABLE
// naming it if there is none (or the store fails).
[[nodiscard]] absl::StatusOr<std::string> lookup_address(
    c10d::Store& store, absl::string_view key_prefix, const WorkerInfo& peer,
    absl::string_view who);

// A dynamic group's agent at init: publishes `mine`, then reads every
// other worker of `workers` into `table` through `to_address` (which turns
// what a peer published into what the backend connects to, or an error).
[[nodiscard]] absl::Status publish_and_look_up(
    c10d::Store& store, absl::string_view key_prefix, const WorkerInfo& self,
    const std::vector<WorkerInfo>& workers, absl::string_view mine,
    PeerTable& table,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        to_address,
    absl::string_view who);

// Agent::add_peer of a backend over a PeerTable: reads `peer`'s address
// and adds it. FAILED_PRECONDITION for a static group (`dynamic` false).
[[nodiscard]] absl::Status add_peer(
    c10d::Store& store, absl::string_view key_prefix, bool dynamic,
    const WorkerInfo& peer, PeerTable& table,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        to_address,
    absl::string_view who);

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_PEER_TABLE_H_
