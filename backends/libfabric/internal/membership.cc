#include "backends/libfabric/internal/agent_state.h"

#include <c10/util/Logging.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "backends/common/peer_table.h"

namespace tether::backends::libfabric::internal {

absl::StatusOr<Record> AgentState::peer_record(const WorkerInfo& worker,
                                          absl::string_view published) const {
  absl::StatusOr<Record> record = decode_record(published);
  if (!record.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(), ": worker '", worker.name, "' (rank ", worker.id,
                     "): ", record.status().message()));
  }
  if (record->provider != fabric_->provider_name()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who(), " uses provider '", fabric_->provider_name(), "' but worker '",
        worker.name, "' (rank ", worker.id, ") uses '", record->provider,
        "': every worker of a group must use the same"));
  }
  if (!worker.name.empty() && !record->name.empty() &&
      record->name != worker.name) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(), ": the address of rank ", worker.id, " is worker '",
                     record->name, "''s, not '", worker.name, "''s"));
  }
  return record;
}

absl::Status AgentState::install_peer(const WorkerInfo& worker,
                                 const Record& record) {
  if (worker.id < 0 || static_cast<uint32_t>(worker.id) >= framing::kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the libfabric backend takes ranks below ",
                     framing::kMaxRanks, ", not ", worker.id));
  }
  const size_t rank = static_cast<size_t>(worker.id);
  if (rank >= ranks_.size()) ranks_.resize(rank + 1);
  absl::StatusOr<std::vector<fi_addr_t>> address =
      fabric_->insert({record.address});
  if (!address.ok()) return address.status();
  Peer peer;
  peer.rank = worker.id;
  peer.name = worker.name;
  peer.address = (*address)[0];
  peer.raw_address = record.address;
  // Frames to it are built in our send buffers (sized at init).
  peer.buffer_size = send_buffer_size_ == 0
                         ? record.buffer_size
                         : std::min(record.buffer_size, send_buffer_size_);
  peer.granted = record.credits;
  peer.credits = record.credits;
  peer.mode = record.mode;
  peer.pid = record.pid;
  peer.same_host = !host_.empty() && record.host == host_;
  // A worker that joins with a leaver's rank is on a new connection.
  peer.epoch = ranks_[rank].epoch + 1;
  if (peer.same_host && !record.doorbell.empty()) {
    peer.doorbell.sun_family = AF_UNIX;
    std::memcpy(peer.doorbell.sun_path, record.doorbell.data(),
                record.doorbell.size());
    peer.doorbell_length = static_cast<socklen_t>(
        offsetof(sockaddr_un, sun_path) + record.doorbell.size());
  } else if (peer.rank != self_.id) {
    all_peers_ring_ = false;
  }
  ranks_[rank] = std::move(peer);
  ++known_peers_;
  // Credits granted to it are backed by buffers.
  return grow_pool(known_peers_);
}

void AgentState::drop_peer(int rank, const absl::Status& why) {
  Peer& peer = ranks_[rank];
  if (absent(peer)) return;
  fail_peer(rank, why);
  for (const std::shared_ptr<Arrival>& in : peer.incoming) {
    in->abandoned = true;
  }
  peer.incoming.clear();
  if (absl::Status removed = fabric_->remove(peer.address); !removed.ok()) {
    LOG(WARNING) << who() << " cannot forget the address of " << describe(rank)
                 << ": " << removed.message();
  }
  VLOG(1) << who() << " drops " << describe(rank) << ": " << why.message();
  peer.address = FI_ADDR_NOTAVAIL;
  peer.left = true;
  peer.talked = false;
  --known_peers_;
}

bool AgentState::adopt_unknown(int rank) {
  const WorkerInfo unknown{absl::StrCat("rank ", rank), rank};
  absl::StatusOr<std::string> text = common::lookup_address(
      *store_, kLibfabricNames.address_key_prefix, unknown, who());
  // Its name is what its record says.
  absl::StatusOr<Record> record =
      text.ok() ? peer_record(WorkerInfo{"", rank}, *text) : text.status();
  if (record.ok() && record->name.empty()) {
    record = absl::InvalidArgumentError("its address record has no name");
  }
  if (installed(rank) && !absent(ranks_[rank])) {
    // A leaving worker's rank: is the frame the leaver's or a joiner's?
    if (!record.ok() || ranks_[rank].raw_address == record->address) {
      return true;
    }
    drop_peer(rank, absl::UnavailableError(absl::StrCat(
                        describe(rank), " has left: worker '", record->name,
                        "' joins with its rank")));
  }
  const WorkerInfo joiner{record.ok() ? record->name : "", rank};
  // A leaver the Worker has not removed yet gives the joiner its rank.
  std::optional<common::Peer> leaver = peers_.by_rank(rank);
  if (record.ok() && leaver.has_value() && leaver->info.name != joiner.name) {
    peers_.remove(leaver->info);
  }
  absl::Status added =
      record.ok() ? peers_.add(common::Peer{joiner, *text}) : record.status();
  if (added.ok()) added = install_peer(joiner, *record);
  if (!added.ok()) {
    if (record.ok()) peers_.remove(joiner);
    LOG(WARNING) << who() << " drops a frame from unknown rank " << rank << ": "
                 << added.message();
    return false;
  }
  LOG(INFO) << who() << ": " << describe(rank)
            << " makes contact before it has been announced (it is joining)";
  return true;
}

absl::Status AgentState::on_peer_added(const common::Peer& peer) {
  const WorkerInfo& worker = peer.info;
  auto result = std::make_shared<absl::Status>();
  absl::Status called = call_on_progress_thread(
      [this, worker, text = peer.address, result] {
        *result = [&]() -> absl::Status {
          absl::StatusOr<Record> record = peer_record(worker, text);
          if (!record.ok()) return record.status();
          if (installed(worker.id) && !absent(ranks_[worker.id])) {
            Peer& known = ranks_[worker.id];
            if (known.name != worker.name && !known.leaving) {
              return absl::AlreadyExistsError(
                  absl::StrCat(who(), ": rank ", worker.id, " is worker '",
                               known.name, "', not '", worker.name, "'"));
            }
            // Its first frame came before MEMBER_JOIN: known already.
            if (known.name == worker.name &&
                known.raw_address == record->address) {
              known.leaving = false;
              return absl::OkStatus();
            }
            drop_peer(worker.id, absl::UnavailableError(absl::StrCat(
                                     describe(worker.id), " has left: worker '",
                                     worker.name, "' joins with its rank")));
          }
          return install_peer(worker, *record);
        }();
      },
      absl::StrCat("add worker '", worker.name, "'"));
  if (!called.ok()) return called;
  return *result;
}

void AgentState::on_peer_removed(const WorkerInfo& worker) {
  post([this, worker] {
    if (!installed(worker.id) || absent(ranks_[worker.id]) ||
        ranks_[worker.id].name != worker.name) {
      return;
    }
    // Dropped on its goodbye, or when a worker joins with its rank: until
    // then it may still answer, and is answered.
    ranks_[worker.id].leaving = true;
  });
}

}  // namespace tether::backends::libfabric::internal
