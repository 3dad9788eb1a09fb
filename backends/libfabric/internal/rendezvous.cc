#include "backends/libfabric/internal/agent_state.h"

#include <c10/util/Logging.h>
#include <rdma/fi_errno.h>

#include <algorithm>

namespace tether::backends::libfabric::internal {

void AgentState::pump_pull(const std::shared_ptr<Arrival>& in) {
  const bool read = mode_ == RendezvousMode::kRead;
  while (in->next_chunk < in->chunks.size() && in->error.ok()) {
    if (read ? !have_tx_room() : rx_inflight_ >= rx_limit_) break;
    const Chunk& chunk = in->chunks[in->next_chunk];
    auto op = std::make_unique<Op>();
    op->kind = read ? OpKind::kRead : OpKind::kBulkReceive;
    op->rank = in->rank;
    op->length = chunk.length;
    op->incoming = in;
    if (chunk.segment == framing::kBodySegment) {
      op->buffer = in->body.data() + chunk.offset;
      op->desc = in->body_region->desc();
      op->remote_address = in->head.body_address + chunk.offset;
      op->key = in->head.body_key;
    } else {
      const SegmentDesc& segment = in->segments[chunk.segment];
      char* base = chunk.segment == 0
                       ? in->message.payload.data()
                       : static_cast<char*>(in->message.storages[chunk.segment - 1]
                                                .data());
      op->buffer = base + chunk.offset;
      op->desc = in->segment_regions[chunk.segment]->desc();
      op->remote_address = segment.address + chunk.offset;
      op->key = segment.key;
    }
    op->tag = framing::bulk_tag(static_cast<uint32_t>(in->rank),
                              in->sequence_base + in->next_chunk);
    const int rc = issue(op.get());
    if (rc == -FI_EAGAIN) {
      refused_ = true;
      break;
    }
    if (rc != 0) {
      in->error = absl::UnavailableError(absl::StrCat(
          "libfabric ", read ? "fi_read" : "fi_trecv", " by worker '",
          self_.name, "' from ", describe(in->rank), " failed: ",
          libfabric::internal::fi_error_text(-rc)));
      break;
    }
    if (read) {
      ++tx_inflight_;
    } else {
      ++rx_inflight_;
    }
    ++in->outstanding;
    ++in->next_chunk;
    inflight_.insert(op.release());
  }
  if (!read && in->next_chunk > in->announced) {
    send_control(in->rank, FrameKind::kClearToSend, in->transfer,
                 in->announced, in->next_chunk - in->announced);
    in->announced = in->next_chunk;
  }
  if (!in->error.ok()) {
    if (in->outstanding == 0) finish_incoming(in);
    return;
  }
  if (in->next_chunk < in->chunks.size()) pulls_waiting_.push_back(in);
}

void AgentState::on_pulled(Op* raw, const absl::Status& status) {
  std::unique_ptr<Op> op(raw);
  inflight_.erase(raw);
  if (op->kind == OpKind::kRead) {
    --tx_inflight_;
  } else {
    --rx_inflight_;
  }
  std::shared_ptr<Arrival> in = std::move(op->incoming);
  --in->outstanding;
  if (status.ok()) {
    ++in->completed;
    stats_.bytes_pulled += op->length;
  } else if (in->error.ok()) {
    in->error = status;
  }
  op.reset();
  if (in->abandoned) return;
  if (!in->error.ok()) {
    if (in->outstanding == 0) finish_incoming(in);
    return;
  }
  if (in->completed < in->chunks.size()) {
    // More to issue (unless waiting already for room).
    if (in->next_chunk < in->chunks.size() &&
        std::find(pulls_waiting_.begin(), pulls_waiting_.end(), in) ==
            pulls_waiting_.end()) {
      pump_pull(in);
    }
    return;
  }
  if (in->pulling_body) {
    in->pulling_body = false;
    const std::string body = std::move(in->body);
    in->body_region.reset();
    absl::Status set = set_up_segments(*in, body);
    if (!set.ok()) {
      in->error = set;
      finish_incoming(in);
      return;
    }
    if (in->completed < in->chunks.size()) {
      pump_pull(in);
      return;
    }
  }
  finish_incoming(in);
}

void AgentState::on_clear_to_send(Peer& peer, uint64_t transfer, uint64_t first,
                             uint64_t count) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end() || it->second->rank != peer.rank) return;
  const std::shared_ptr<Transfer>& found = it->second;
  if (first > found->chunks.size() || count > found->chunks.size() - first) {
    LOG(WARNING) << who() << ": " << describe(peer.rank) << " asks for chunks "
                 << first << " + " << count << " of " << found->chunks.size();
    return;
  }
  sends_waiting_.push_back(SendRange{found, first, first + count});
  pump_sends();
}

bool AgentState::pump_sends() {
  bool worked = false;
  while (!sends_waiting_.empty()) {
    SendRange& range = sends_waiting_.front();
    const std::shared_ptr<Transfer>& transfer = range.transfer;
    if (ranks_[transfer->rank].lost) {
      sends_waiting_.pop_front();
      continue;
    }
    while (range.next < range.end && have_tx_room()) {
      const Chunk& chunk = transfer->chunks[range.next];
      auto op = std::make_unique<Op>();
      op->kind = OpKind::kBulkSend;
      op->rank = transfer->rank;
      op->length = chunk.length;
      op->transfer = transfer;
      const char* base = chunk.segment == framing::kBodySegment
                             ? transfer->body.data()
                             : transfer->segment_data[chunk.segment];
      op->buffer = const_cast<char*>(base) + chunk.offset;
      op->desc = chunk.segment == framing::kBodySegment
                     ? transfer->body_region->desc()
                     : transfer->segment_desc[chunk.segment];
      op->tag = framing::bulk_tag(static_cast<uint32_t>(self_.id),
                                transfer->sequence_base + range.next);
      const int rc = issue(op.get());
      if (rc == -FI_EAGAIN) {
        refused_ = true;
        return worked;
      }
      worked = true;
      ++range.next;
      if (rc != 0) {
        fail_peer(transfer->rank,
                  absl::UnavailableError(absl::StrCat(
                      "libfabric bulk send from worker '", self_.name,
                      "' to ", describe(transfer->rank), " failed: ",
                      libfabric::internal::fi_error_text(-rc))));
        break;
      }
      ++tx_inflight_;
      inflight_.insert(op.release());
    }
    if (range.next < range.end && !ranks_[transfer->rank].lost) break;
    sends_waiting_.pop_front();
  }
  return worked;
}

}  // namespace tether::backends::libfabric::internal
