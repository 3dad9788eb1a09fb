#include "backends/common/peer_table.h"

#include <absl/strings/str_cat.h>

#include <exception>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>

namespace tether::backends::common {

PeerTable::PeerTable(const std::vector<WorkerInfo>& workers) {
  for (const WorkerInfo& worker : workers) {
    by_rank_[worker.id] = Peer{worker, ""};
    rank_by_name_[worker.name] = worker.id;
  }
}

std::optional<Peer> PeerTable::by_name(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto rank = rank_by_name_.find(name);
  if (rank == rank_by_name_.end()) return std::nullopt;
  return by_rank_.at(rank->second);
}

std::optional<Peer> PeerTable::by_rank(int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = by_rank_.find(rank);
  if (it == by_rank_.end()) return std::nullopt;
  return it->second;
}

std::string PeerTable::name_of(int rank) const {
  std::optional<Peer> peer = by_rank(rank);
  return peer.has_value() ? peer->info.name : absl::StrCat("rank ", rank);
}

void PeerTable::set_address(int rank, std::string address) {
  absl::MutexLock lock(&mu_);
  auto it = by_rank_.find(rank);
  if (it != by_rank_.end()) it->second.address = std::move(address);
}

absl::Status PeerTable::add(Peer peer) {
  absl::MutexLock lock(&mu_);
  auto rank = by_rank_.find(peer.info.id);
  if (rank != by_rank_.end() && rank->second.info.name != peer.info.name) {
    return absl::AlreadyExistsError(absl::StrCat(
        "rank ", peer.info.id, " belongs to worker '", rank->second.info.name,
        "', not '", peer.info.name, "'"));
  }
  auto name = rank_by_name_.find(peer.info.name);
  if (name != rank_by_name_.end() && name->second != peer.info.id) {
    return absl::AlreadyExistsError(absl::StrCat(
        "worker '", peer.info.name, "' has rank ", name->second, ", not ",
        peer.info.id));
  }
  rank_by_name_[peer.info.name] = peer.info.id;
  by_rank_[peer.info.id] = std::move(peer);
  return absl::OkStatus();
}

bool PeerTable::remove(const WorkerInfo& info) {
  absl::MutexLock lock(&mu_);
  auto it = by_rank_.find(info.id);
  if (it == by_rank_.end() || !(it->second.info == info)) return false;
  by_rank_.erase(it);
  rank_by_name_.erase(info.name);
  return true;
}

absl::Status publish_address(c10d::Store& store, absl::string_view key_prefix,
                             int rank, absl::string_view mine,
                             absl::string_view who) {
  try {
    store.set(absl::StrCat(key_prefix, rank),
              std::vector<uint8_t>(mine.begin(), mine.end()));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(who, ": the rendezvous store failed: ", e.what()));
  }
}

absl::StatusOr<std::string> lookup_address(c10d::Store& store,
                                           absl::string_view key_prefix,
                                           const WorkerInfo& peer,
                                           absl::string_view who) {
  const std::string key = absl::StrCat(key_prefix, peer.id);
  try {
    if (!store.check({key})) {
      return absl::UnavailableError(absl::StrCat(
          who, " finds no address of worker '", peer.name, "' (rank ",
          peer.id, ") in the rendezvous store"));
    }
    std::vector<uint8_t> bytes = store.get(key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(who, ": the rendezvous store failed: ", e.what()));
  }
}

absl::Status publish_and_look_up(
    c10d::Store& store, absl::string_view key_prefix, const WorkerInfo& self,
    const std::vector<WorkerInfo>& workers, absl::string_view mine,
    PeerTable& table,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        to_address,
    absl::string_view who) {
  if (absl::Status published =
          publish_address(store, key_prefix, self.id, mine, who);
      !published.ok()) {
    return published;
  }
  for (const WorkerInfo& worker : workers) {
    absl::StatusOr<std::string> published =
        worker == self ? std::string(mine)
                       : lookup_address(store, key_prefix, worker, who);
    if (!published.ok()) return published.status();
    absl::StatusOr<std::string> address = to_address(*published);
    if (!address.ok()) return address.status();
    table.set_address(worker.id, *std::move(address));
  }
  return absl::OkStatus();
}

absl::Status add_peer(
    c10d::Store& store, absl::string_view key_prefix, bool dynamic,
    const WorkerInfo& peer, PeerTable& table,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        to_address,
    absl::string_view who) {
  if (!dynamic) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " is in a static group (it was given a world size): worker '",
        peer.name, "' cannot join it"));
  }
  absl::StatusOr<std::string> published =
      lookup_address(store, key_prefix, peer, who);
  if (!published.ok()) return published.status();
  absl::StatusOr<std::string> address = to_address(*published);
  if (!address.ok()) return address.status();
  return table.add(Peer{peer, *std::move(address)});
}

}  // namespace tether::backends::common
