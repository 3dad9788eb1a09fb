#include "backends/libfabric/internal/agent_state.h"

#include <c10/util/Logging.h>
#include <rdma/fi_errno.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "core/toolkit/check.h"

namespace tether::backends::libfabric::internal {

void AgentState::enqueue(int rank, OutFrame frame) {
  Peer& peer = ranks_[rank];
  if (peer.lost) return;
  peer.queue.push_back(std::move(frame));
  flush(peer);
  if (!peer.queue.empty() && !peer.queued_listed) {
    peer.queued_listed = true;
    queued_ranks_.push_back(rank);
  }
}

void AgentState::send_control(int rank, FrameKind kind, uint64_t arg0,
                         uint64_t arg1, uint64_t arg2) {
  OutFrame frame;
  frame.header.kind = kind;
  frame.header.arg0 = arg0;
  frame.header.arg1 = arg1;
  frame.header.arg2 = arg2;
  enqueue(rank, std::move(frame));
}

AgentState::Sent AgentState::transmit(Peer& peer, OutFrame& out, bool control) {
  if (control ? !peer.control_slot_free : peer.credits == 0) {
    if (!control) ++stats_.credit_waits;
    return Sent::kWait;
  }
  if (free_send_buffers_.empty() || !have_tx_room()) return Sent::kWait;
  const size_t length = framing::kHeaderSize + out.tail.size();
  TETHER_CHECK(length <= peer.buffer_size && length <= send_buffer_size_,
               "a libfabric frame larger than the peer's eager buffer");
  Op* op = send_ops_[free_send_buffers_.back()].get();
  FrameHeader header = out.header;
  header.src_rank = static_cast<uint32_t>(self_.id);
  header.credits = static_cast<uint16_t>(std::min<uint32_t>(peer.owed, 0xffff));
  if (peer.control_slot_owed) header.flags |= framing::kFlagReturnsControlSlot;
  if (control) header.flags |= framing::kFlagControlSlot;
  framing::write_header(header, op->buffer);
  if (!out.tail.empty()) {
    std::memcpy(op->buffer + framing::kHeaderSize, out.tail.data(),
                out.tail.size());
  }
  op->length = length;
  op->rank = peer.rank;
  const int rc = issue(op);
  if (rc == -FI_EAGAIN) {
    refused_ = true;
    return Sent::kWait;
  }
  if (rc != 0) {
    fail_peer(peer.rank, absl::UnavailableError(absl::StrCat(
                             "libfabric send from worker '", self_.name,
                             "' to ", describe(peer.rank), " failed: ",
                             libfabric::internal::fi_error_text(-rc))));
    return Sent::kFailed;
  }
  free_send_buffers_.pop_back();
  ++tx_inflight_;
  peer.owed -= header.credits;
  if (peer.control_slot_owed) peer.control_slot_owed = false;
  if (control) {
    peer.control_slot_free = false;
  } else {
    --peer.credits;
  }
  if (header.kind == FrameKind::kKeepaliveAck) peer.ack_queued = false;
  peer.talked = true;
  ++stats_.frames_sent;
  if (peer.doorbell_length > 0 && peer.rank != self_.id) {
    // A full doorbell already has a wake-up pending: EAGAIN is fine.
    const char ring = 0;
    ::sendto(doorbell_fd_, &ring, 1, MSG_DONTWAIT,
             reinterpret_cast<const sockaddr*>(&peer.doorbell),
             peer.doorbell_length);
  }
  stats_.max_frames_in_flight =
      std::max(stats_.max_frames_in_flight, in_flight(peer));
  return Sent::kSent;
}

bool AgentState::flush(Peer& peer) {
  bool worked = false;
  while (!peer.queue.empty()) {
    const Sent sent = transmit(peer, peer.queue.front(), /*control=*/false);
    if (sent == Sent::kWait) break;
    worked = true;
    if (sent == Sent::kFailed) break;  // fail_peer() emptied the queue
    peer.queue.pop_front();
  }
  return worked;
}

bool AgentState::send_due_credits() {
  bool worked = false;
  std::vector<int> ranks;
  ranks.swap(credit_due_);
  for (int rank : ranks) {
    Peer& peer = ranks_[rank];
    peer.credit_listed = false;
    const uint32_t threshold = std::max<uint32_t>(1, credits_ / 2);
    if (peer.owed < threshold || peer.lost) continue;  // returned meanwhile
    OutFrame out;
    out.header.kind = FrameKind::kCredit;
    const Sent sent = transmit(peer, out, /*control=*/true);
    if (sent == Sent::kWait) {
      peer.credit_listed = true;
      credit_due_.push_back(rank);
      continue;
    }
    worked = true;
  }
  return worked;
}

void AgentState::on_frame(Op* op, size_t length) {
  absl::string_view bytes(op->buffer, length);
  absl::StatusOr<FrameHeader> header = framing::read_header(bytes);
  const bool unknown = header.ok() && (header->src_rank >= ranks_.size() ||
                                       absent(ranks_[header->src_rank]));
  // In a dynamic group, a joiner's first word (its hello or a request) may
  // come before the Worker has been told of it, and its rank may be that of
  // a worker that is leaving.
  const bool first_word = header.ok() && dynamic_ &&
                          (header->kind == FrameKind::kAuth ||
                           header->kind == FrameKind::kRequest);
  if (unknown || (first_word && ranks_[header->src_rank].leaving)) {
    if (!first_word || !adopt_unknown(static_cast<int>(header->src_rank))) {
      header = absl::InvalidArgumentError(absl::StrCat(
          "source rank ", header->src_rank, " not in the group"));
    }
  }
  if (!header.ok()) {
    LOG(WARNING) << who() << " drops a frame: " << header.status().message();
    return;
  }
  ++stats_.frames_received;
  Peer& peer = ranks_[header->src_rank];
  heard_from(peer);
  peer.talked = true;
  peer.credits = std::min(peer.granted, peer.credits + header->credits);
  if (header->flags & framing::kFlagReturnsControlSlot) {
    peer.control_slot_free = true;
  }
  if (header->flags & framing::kFlagControlSlot) {
    peer.control_slot_owed = true;
  } else {
    ++peer.owed;
    if (peer.owed >= std::max<uint32_t>(1, credits_ / 2) &&
        !peer.credit_listed) {
      peer.credit_listed = true;
      credit_due_.push_back(peer.rank);
    }
  }
  // Credits may let queued frames go.
  if (!peer.queue.empty() && !peer.queued_listed) {
    peer.queued_listed = true;
    queued_ranks_.push_back(peer.rank);
  }
  if (!admitted(peer, *header)) return;
  switch (header->kind) {
    case FrameKind::kAuth:
      on_auth_frame(peer, bytes.substr(framing::kHeaderSize));
      return;
    case FrameKind::kRequest:
    case FrameKind::kResponse:
    case FrameKind::kError:
      on_message_frame(peer, *header, bytes.substr(framing::kHeaderSize));
      return;
    case FrameKind::kRelease: {
      auto it = transfers_.find(header->arg0);
      if (it != transfers_.end() && it->second->rank == peer.rank) {
        transfers_.erase(it);
        peer.transfers.erase(header->arg0);
      }
      return;
    }
    case FrameKind::kClearToSend:
      on_clear_to_send(peer, header->arg0, header->arg1, header->arg2);
      return;
    case FrameKind::kKeepalive:
      if (!peer.ack_queued) {
        peer.ack_queued = true;
        send_control(peer.rank, FrameKind::kKeepaliveAck);
      }
      return;
    case FrameKind::kKeepaliveAck:
    case FrameKind::kCredit:
      return;
    case FrameKind::kGoodbye:
      fail_peer(peer.rank, common::peer_shut_down(
                               self_.name, name_at(peer.rank), peer.rank));
      peer.gone = true;
      if (peer.leaving) {
        drop_peer(peer.rank,
                  common::peer_left(self_.name, name_at(peer.rank), peer.rank));
      }
      return;
  }
}

}  // namespace tether::backends::libfabric::internal
