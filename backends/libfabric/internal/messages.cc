#include "backends/libfabric/internal/agent_state.h"

#include <c10/util/Logging.h>

#include <cstring>
#include <exception>

#include "core/toolkit/receive_buffers.h"

namespace tether::backends::libfabric::internal {

namespace {

absl::Status status_from_code(int32_t code, std::string text) {
  if (code <= 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<int32_t>(absl::StatusCode::kUnknown);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), text);
}

}  // namespace

void AgentState::start_request(int rank, int64_t id, Message request) {
  if (!installed(rank)) {  // in the table, not yet installed (add_peer())
    pending_.complete(
        id, absl::UnavailableError(absl::StrCat(
                who(), ": worker '", peers_.name_of(rank), "' (rank ", rank,
                ") is joining and cannot be reached yet")));
    return;
  }
  Peer& peer = ranks_[rank];
  if (peer.lost) {
    pending_.complete(id, *peer.lost);
    return;
  }
  // Sent even if it has timed out meanwhile: a timeout ends the caller's
  // wait, not the delivery (PendingRequests::set_connection). Its response
  // is then let go unread.
  if (pending_.set_connection(id, connection_of(peer))) {
    peer.requests.insert(id);
  }
  request.id = id;
  if (auth_ && peer.client_auth != Peer::ClientAuth::kReady) {
    peer.auth_waiting.emplace_back(id, std::move(request));
    if (peer.client_auth == Peer::ClientAuth::kNone) start_client_auth(peer);
    return;
  }
  send_message(rank, FrameKind::kRequest, id, 0, std::move(request));
}

void AgentState::respond(int rank, int64_t id,
                    const absl::StatusOr<Message>& result) {
  if (result.ok()) {
    send_message(rank, FrameKind::kResponse, id, 0, *result);
  } else {
    Message text;
    text.payload = std::string(result.status().message());
    send_message(rank, FrameKind::kError, id, result.status().raw_code(),
                 std::move(text));
  }
  incoming_.answered();
}

void AgentState::send_message(int rank, FrameKind kind, int64_t id, int32_t code,
                         Message message) {
  Peer& peer = ranks_[rank];
  auto fail = [&](const absl::Status& status) {
    if (kind == FrameKind::kRequest) {
      peer.requests.erase(id);
      pending_.complete(id, status);
    } else if (kind == FrameKind::kResponse) {
      Message text;
      text.payload = std::string(status.message());
      send_message(rank, FrameKind::kError, id, status.raw_code(),
                   std::move(text));
    }
    // An error that cannot go is dropped: its requester loses us or times
    // out.
  };
  if (peer.lost) {
    if (kind == FrameKind::kRequest) fail(*peer.lost);
    return;
  }
  for (const c10::Storage& storage : message.storages) {
    if (!storage.device().is_cpu()) {
      fail(absl::InvalidArgumentError(absl::StrCat(
          "the libfabric backend moves CPU storages only; a response of "
          "worker '",
          self_.name, "' has one on ", storage.device().str())));
      return;
    }
  }

  // Segment 0 is the payload, segment i + 1 storage i.
  std::vector<SegmentDesc> segments(1 + message.storages.size());
  segments[0].size = message.payload.size();
  for (size_t i = 0; i < message.storages.size(); ++i) {
    segments[i + 1].size = message.storages[i].nbytes();
  }
  bool any_remote = false;
  for (SegmentDesc& segment : segments) {
    if (segment.size >= threshold_) {
      segment.remote = true;
      any_remote = true;
    }
  }
  const uint64_t body = framing::body_size(segments);
  const bool body_remote =
      framing::kHeaderSize + framing::kMessageHeadSize + body > peer.buffer_size;

  OutFrame out;
  out.header.kind = kind;
  MessageHead head;
  head.type = message.type;
  head.code = code;
  head.id = id;
  head.body_size = body;

  std::shared_ptr<Transfer> transfer;
  std::vector<const char*> data(segments.size(), nullptr);
  Message* source = &message;
  if (any_remote || body_remote) {
    transfer = std::make_shared<Transfer>();
    transfer->id = next_transfer_++;
    transfer->rank = rank;
    transfer->message = std::move(message);
    source = &transfer->message;
  }
  data[0] = source->payload.data();
  for (size_t i = 0; i < source->storages.size(); ++i) {
    data[i + 1] = static_cast<const char*>(source->storages[i].data());
  }
  if (transfer != nullptr) {
    const bool read = peer.mode == RendezvousMode::kRead;
    const uint64_t access = read ? FI_REMOTE_READ : FI_SEND;
    transfer->segment_data = data;
    transfer->segment_desc.assign(segments.size(), nullptr);
    for (size_t i = 0; i < segments.size(); ++i) {
      if (!segments[i].remote) continue;
      const MemoryRegion* region = nullptr;
      if (i == 0) {
        absl::StatusOr<std::unique_ptr<MemoryRegion>> made =
            fabric_->register_memory(data[0], segments[0].size, access);
        if (!made.ok()) {
          fail(made.status());
          return;
        }
        transfer->payload_region = *std::move(made);
        region = transfer->payload_region.get();
      } else {
        absl::StatusOr<MrCache::Handle> handle =
            mr_cache_->acquire(source->storages[i - 1], access);
        if (!handle.ok()) {
          fail(handle.status());
          return;
        }
        transfer->storage_regions.push_back(*std::move(handle));
        region = &transfer->storage_regions.back().region();
      }
      transfer->segment_desc[i] = region->desc();
      if (read) {
        segments[i].address = region->remote_address(data[i]);
        segments[i].key = region->key();
      }
    }
    if (body_remote) {
      transfer->body.resize(body);
      framing::write_body(segments, data, transfer->body.data());
      absl::StatusOr<std::unique_ptr<MemoryRegion>> made =
          fabric_->register_memory(transfer->body.data(), body, access);
      if (!made.ok()) {
        fail(made.status());
        return;
      }
      transfer->body_region = *std::move(made);
      out.header.flags |= framing::kFlagBodyRemote;
      if (read) {
        head.body_address =
            transfer->body_region->remote_address(transfer->body.data());
        head.body_key = transfer->body_region->key();
      }
    }
    if (!read) {
      absl::Status planned = absl::OkStatus();
      if (body_remote) {
        planned = framing::plan_body_chunks(body, chunk_size_, transfer->chunks);
      }
      if (planned.ok()) {
        planned = framing::plan_chunks(segments, chunk_size_, transfer->chunks);
      }
      if (!planned.ok()) {
        fail(absl::InvalidArgumentError(absl::StrCat(
            "a message too large for the libfabric backend: ",
            planned.message())));
        return;
      }
      transfer->sequence_base = next_sequence_;
      next_sequence_ += transfer->chunks.size();
    }
    out.header.arg0 = transfer->id;
    out.header.arg1 = transfer->sequence_base;
    out.header.arg2 = chunk_size_;
    transfers_[transfer->id] = transfer;
    peer.transfers.insert(transfer->id);
    ++stats_.rendezvous_sent;
  }
  out.tail.resize(framing::kMessageHeadSize + (body_remote ? 0 : body));
  framing::write_message_head(head, out.tail.data());
  if (!body_remote) {
    framing::write_body(segments, data,
                      out.tail.data() + framing::kMessageHeadSize);
  }
  enqueue(rank, std::move(out));
}

void AgentState::on_message_frame(Peer& peer, const FrameHeader& header,
                             absl::string_view rest) {
  const int rank = peer.rank;
  const uint64_t transfer = header.arg0;
  absl::StatusOr<MessageHead> head = framing::read_message_head(rest);
  if (!head.ok()) {
    LOG(WARNING) << who() << " drops a message from " << describe(rank) << ": "
                 << head.status().message();
    if (transfer != 0) send_control(rank, FrameKind::kRelease, transfer);
    return;
  }
  if (header.kind != FrameKind::kRequest && !peer.requests.contains(head->id)) {
    // A response to a request that timed out (or a stray one): let its
    // buffers go unread.
    if (transfer != 0) send_control(rank, FrameKind::kRelease, transfer);
    return;
  }
  auto in = std::make_shared<Arrival>();
  in->rank = rank;
  in->kind = header.kind;
  in->head = *head;
  in->transfer = transfer;
  in->sequence_base = header.arg1;
  in->chunk_size = header.arg2;
  if (header.kind == FrameKind::kRequest) {
    in->message.type = head->type;
    in->message.id = head->id;
  }
  absl::Status status = absl::OkStatus();
  const bool remote = transfer != 0;
  if (remote && (in->chunk_size < framing::kMinChunkSize ||
                 in->chunk_size > fabric_->max_message_size())) {
    status = absl::InvalidArgumentError(
        absl::StrCat("chunk size ", in->chunk_size, " from ", describe(rank)));
  }
  if (status.ok() && (header.flags & framing::kFlagBodyRemote)) {
    if (!remote) {
      status = absl::InvalidArgumentError("a remote body without a transfer");
    } else if (head->body_size > framing::max_body_size(limits_)) {
      // Before allocating it: no message within the limits has one as large.
      status = absl::ResourceExhaustedError(absl::StrCat(
          "a message body of ", head->body_size,
          " bytes is over what the limits allow (MessageLimits: ",
          limits_.max_payload_bytes, " payload bytes, ", limits_.max_storages,
          " storages, ", limits_.max_storage_bytes, " storage bytes)"));
    } else {
      in->pulling_body = true;
      try {
        in->body.resize(head->body_size);
      } catch (const std::exception& e) {
        status = absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate a message body of ",
                         head->body_size, " bytes: ", e.what()));
      }
      if (status.ok()) {
        absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
            fabric_->register_memory(
                in->body.data(), in->body.size(),
                mode_ == RendezvousMode::kRead ? FI_READ : FI_RECV);
        if (region.ok()) {
          in->body_region = *std::move(region);
          status = framing::plan_body_chunks(head->body_size, in->chunk_size,
                                           in->chunks);
        } else {
          status = region.status();
        }
      }
    }
  } else if (status.ok()) {
    absl::string_view body = rest.substr(framing::kMessageHeadSize);
    if (body.size() != head->body_size) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "an inline body of ", body.size(), " bytes announced as ",
          head->body_size));
    } else {
      status = set_up_segments(*in, body);
    }
  }
  if (remote) {
    peer.incoming.insert(in);
    ++stats_.rendezvous_received;
  }
  if (!status.ok()) {
    in->error = status;
    finish_incoming(in);
    return;
  }
  if (in->chunks.empty()) {
    finish_incoming(in);
    return;
  }
  pump_pull(in);
}

absl::Status AgentState::set_up_segments(Arrival& in, absl::string_view bytes) {
  absl::StatusOr<Body> body = framing::read_body(bytes);
  if (!body.ok()) return body.status();
  if (in.kind == FrameKind::kError && body->segments.size() != 1) {
    return absl::InvalidArgumentError("storages in an error message");
  }
  // Before allocating anything for it (storages, pulls).
  if (absl::Status within = framing::check_limits(*body, limits_); !within.ok()) {
    return within;
  }
  Message& message = in.message;
  try {
    message.payload.resize(body->segments[0].size);
    message.storages.reserve(body->segments.size() - 1);
    for (size_t i = 1; i < body->segments.size(); ++i) {
      // Large ones reuse buffers that received earlier tensors.
      message.storages.push_back(tether::internal::receive_storage(
          static_cast<size_t>(body->segments[i].size)));
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a message of ", body->segments.size(),
        " segments: ", e.what()));
  }
  in.segment_regions.resize(body->segments.size());
  bool any_remote = false;
  for (size_t i = 0; i < body->segments.size(); ++i) {
    const SegmentDesc& segment = body->segments[i];
    char* destination =
        i == 0 ? message.payload.data()
               : static_cast<char*>(message.storages[i - 1].data());
    if (!segment.remote) {
      if (segment.size > 0) {
        std::memcpy(destination, body->inline_data[i], segment.size);
      }
      continue;
    }
    any_remote = true;
    absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
        fabric_->register_memory(
            destination, segment.size,
            mode_ == RendezvousMode::kRead ? FI_READ : FI_RECV);
    if (!region.ok()) return region.status();
    in.segment_regions[i] = *std::move(region);
  }
  if (any_remote && in.transfer == 0) {
    return absl::InvalidArgumentError("remote segments without a transfer");
  }
  in.segments = std::move(body->segments);
  return framing::plan_chunks(in.segments, in.chunk_size, in.chunks);
}

void AgentState::finish_incoming(const std::shared_ptr<Arrival>& in) {
  Peer& peer = ranks_[in->rank];
  peer.incoming.erase(in);
  in->segment_regions.clear();
  in->body_region.reset();
  if (in->abandoned) return;
  in->abandoned = true;  // done: later completions of it do nothing
  if (in->transfer != 0) send_control(in->rank, FrameKind::kRelease, in->transfer);
  if (in->error.ok()) {
    deliver(*in);
    return;
  }
  const absl::Status error = in->error;
  if (in->kind == FrameKind::kRequest) {
    Message text;
    text.payload = absl::StrCat(who(), " could not receive a ",
                                message_type_name(in->head.type), " from ",
                                describe(in->rank), ": ", error.message());
    send_message(in->rank, FrameKind::kError, in->head.id, error.raw_code(),
                 std::move(text));
    return;
  }
  if (peer.requests.erase(in->head.id) > 0) {
    pending_.complete(in->head.id,
                      absl::Status(error.code(),
                                   absl::StrCat("receiving the response from ",
                                                describe(in->rank), ": ",
                                                error.message())));
  }
}

void AgentState::deliver(Arrival& in) {
  Peer& peer = ranks_[in.rank];
  switch (in.kind) {
    case FrameKind::kRequest:
      incoming_.arrived(in.rank, std::move(in.message));
      return;
    case FrameKind::kResponse:
      if (peer.requests.erase(in.head.id) > 0) {
        in.message.type = in.head.type;
        in.message.id = in.head.id;
        pending_.complete(in.head.id, std::move(in.message));
      }
      return;
    case FrameKind::kError:
      if (peer.requests.erase(in.head.id) > 0) {
        pending_.complete(in.head.id,
                          status_from_code(in.head.code,
                                           std::move(in.message.payload)));
      }
      return;
    default:
      return;
  }
}

}  // namespace tether::backends::libfabric::internal
