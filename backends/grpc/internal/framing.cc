#include "backends/grpc/internal/framing.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <new>

#include "backends/common/bytes.h"
#include "backends/grpc/internal/settings.h"
#include "core/toolkit/receive_buffers.h"

namespace tether::backends::grpc::internal {
namespace {

using common::get_le;
using common::put_le;

constexpr char kMagic[4] = {'T', 'G', 'F', '1'};
constexpr uint8_t kFlagResponse = 1;
// The highest absl::StatusCode.
constexpr int32_t kMaxStatusCode = 16;

void put_prefix(uint8_t*& out, FrameKind kind, uint8_t flags,
                uint64_t body_bytes) {
  std::memcpy(out, kMagic, sizeof(kMagic));
  out += sizeof(kMagic);
  put_le<uint8_t>(out, static_cast<uint8_t>(kind));
  put_le<uint8_t>(out, flags);
  put_le<uint16_t>(out, 0);
  put_le<uint64_t>(out, body_bytes);
}

absl::Status malformed(absl::string_view what) {
  return common::malformed("gRPC agent frame", what);
}

// Fills in the derived fields of `message`.
std::shared_ptr<const OutgoingMessage> finish(
    std::shared_ptr<OutgoingMessage> message) {
  message->sizes.reserve(message->storages.size() + 1);
  message->sizes.push_back(message->payload.size());
  for (const c10::Storage& storage : message->storages) {
    message->sizes.push_back(storage.nbytes());
  }
  for (uint64_t size : message->sizes) {
    const bool fits = size <= kInlineLimit - message->inline_bytes;
    message->inline_buffer.push_back(fits);
    if (fits) message->inline_bytes += size;
  }
  return message;
}

const uint8_t* buffer_data(const OutgoingMessage& message, size_t buffer) {
  if (buffer == 0) {
    return reinterpret_cast<const uint8_t*>(message.payload.data());
  }
  return static_cast<const uint8_t*>(message.storages[buffer - 1].data());
}

void release_message(void* owner) {
  delete static_cast<std::shared_ptr<const OutgoingMessage>*>(owner);
}

}  // namespace

uint64_t OutgoingMessage::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t size : sizes) total += size;
  return total;
}

std::shared_ptr<const OutgoingMessage> make_request(Message message) {
  auto out = std::make_shared<OutgoingMessage>();
  out->kind = FrameKind::kRequest;
  out->type = message.type;
  out->id = message.id;
  out->payload = std::move(message.payload);
  out->storages = std::move(message.storages);
  return finish(std::move(out));
}

std::shared_ptr<const OutgoingMessage> make_response(
    int64_t id, const absl::StatusOr<Message>& result) {
  auto out = std::make_shared<OutgoingMessage>();
  out->id = id;
  if (result.ok()) {
    out->kind = FrameKind::kResponse;
    out->type = result->type;
    out->payload = result->payload;
    out->storages = result->storages;
  } else {
    out->kind = FrameKind::kError;
    out->type = MessageType::kException;
    out->code = static_cast<int32_t>(result.status().code());
    out->payload = std::string(result.status().message());
  }
  return finish(std::move(out));
}

absl::Status check_limits(const OutgoingMessage& message,
                          uint64_t max_message_bytes, absl::string_view what) {
  if (message.storages.size() > kMaxStorages) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " has ", message.storages.size(),
                     " storages; the gRPC agent sends at most ", kMaxStorages));
  }
  const uint64_t total = message.total_bytes();
  if (total > max_message_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " has ", total, " bytes, over the limit of ",
                     max_message_bytes, " (setting grpc.max_message_bytes)"));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ sending

void OutgoingCursor::skip_to_chunked() {
  const OutgoingMessage& message = *message_;
  while (buffer_ < message.sizes.size() &&
         (message.inline_buffer[buffer_] || message.sizes[buffer_] == 0)) {
    ++buffer_;
  }
  offset_ = 0;
  done_ = buffer_ == message.sizes.size();
}

size_t OutgoingCursor::append_next_frame(size_t chunk_bytes,
                                         std::vector<::grpc::Slice>& out) {
  const OutgoingMessage& message = *message_;
  if (!head_sent_) {
    head_sent_ = true;
    const uint64_t body =
        kHeadFixedBytes + 8 * message.sizes.size() + message.inline_bytes;
    ::grpc::Slice slice(kPrefixBytes + body);
    auto* p = const_cast<uint8_t*>(slice.begin());
    put_prefix(p, message.kind, 0, body);
    put_le<int32_t>(p, static_cast<int32_t>(message.type));
    put_le<int32_t>(p, message.code);
    put_le<int64_t>(p, message.id);
    put_le<uint32_t>(p, static_cast<uint32_t>(message.sizes.size()));
    put_le<uint32_t>(p, 0);
    for (uint64_t size : message.sizes) put_le<uint64_t>(p, size);
    for (size_t i = 0; i < message.sizes.size(); ++i) {
      if (!message.inline_buffer[i] || message.sizes[i] == 0) continue;
      std::memcpy(p, buffer_data(message, i), message.sizes[i]);
      p += message.sizes[i];
    }
    out.push_back(std::move(slice));
    buffer_ = 0;
    skip_to_chunked();
    return kPrefixBytes + body;
  }
  const uint64_t length =
      std::min<uint64_t>(chunk_bytes, message.sizes[buffer_] - offset_);
  ::grpc::Slice header(kPrefixBytes + kChunkFixedBytes);
  auto* p = const_cast<uint8_t*>(header.begin());
  put_prefix(p, FrameKind::kChunk,
             message.kind == FrameKind::kRequest ? 0 : kFlagResponse,
             kChunkFixedBytes + length);
  put_le<int64_t>(p, message.id);
  put_le<uint32_t>(p, static_cast<uint32_t>(buffer_));
  put_le<uint32_t>(p, 0);
  put_le<uint64_t>(p, offset_);
  out.push_back(std::move(header));
  // gRPC only reads through the slice; the message lives as long as it.
  auto* data = const_cast<uint8_t*>(buffer_data(message, buffer_)) + offset_;
  out.emplace_back(data, static_cast<size_t>(length), &release_message,
                   new std::shared_ptr<const OutgoingMessage>(message_));
  offset_ += length;
  if (offset_ == message.sizes[buffer_]) {
    ++buffer_;
    skip_to_chunked();
  }
  return kPrefixBytes + kChunkFixedBytes + length;
}

::grpc::Slice make_auth_frame(const AuthFrame& frame) {
  const uint64_t body = 8 + frame.name.size() + frame.data.size();
  ::grpc::Slice slice(kPrefixBytes + body);
  auto* p = const_cast<uint8_t*>(slice.begin());
  put_prefix(p, FrameKind::kAuth, 0, body);
  put_le<uint8_t>(p, static_cast<uint8_t>(frame.step));
  put_le<uint8_t>(p, 0);
  put_le<uint16_t>(p, 0);
  put_le<uint32_t>(p, static_cast<uint32_t>(frame.name.size()));
  std::memcpy(p, frame.name.data(), frame.name.size());
  p += frame.name.size();
  std::memcpy(p, frame.data.data(), frame.data.size());
  return slice;
}

// ---------------------------------------------------------------- receiving

// Reads bytes across the slices of one gRPC message, up to a limit.
class Assembler::Reader {
 public:
  explicit Reader(const std::vector<::grpc::Slice>& slices) : slices_(&slices) {
    for (const ::grpc::Slice& slice : slices) remaining_ += slice.size();
  }

  uint64_t remaining() const { return remaining_; }

  // The next `bytes` bytes as a reader of their own (bytes <= remaining()).
  Reader take(uint64_t bytes) {
    Reader part = *this;
    part.remaining_ = bytes;
    skip(bytes);
    return part;
  }

  // Copies `bytes` bytes to `out` (nullptr: skips them); false if fewer are
  // left.
  bool read(void* out, uint64_t bytes) {
    if (bytes > remaining_) return false;
    remaining_ -= bytes;
    auto* dst = static_cast<uint8_t*>(out);
    while (bytes > 0) {
      const ::grpc::Slice& slice = (*slices_)[index_];
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(bytes, slice.size() - offset_));
      if (dst != nullptr) {
        std::memcpy(dst, slice.begin() + offset_, n);
        dst += n;
      }
      bytes -= n;
      offset_ += n;
      if (offset_ == slice.size()) {
        ++index_;
        offset_ = 0;
      }
    }
    return true;
  }

  bool skip(uint64_t bytes) { return read(nullptr, bytes); }

 private:
  const std::vector<::grpc::Slice>* slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
  uint64_t remaining_ = 0;
};

struct Assembler::Partial {
  FrameKind kind = FrameKind::kRequest;
  MessageType type = MessageType::kUnknown;
  int32_t code = 0;
  int64_t id = -1;
  std::vector<uint64_t> sizes;
  std::vector<bool> inline_buffer;
  // Per buffer, the chunked bytes received so far.
  std::vector<uint64_t> received;
  uint64_t remaining = 0;  // chunked bytes still to come
  // Set when this side refused the message: its bytes are skipped.
  absl::Status refused;
  // Whether finish() has given its result already (a refused message is
  // answered at its head, before the bytes it still has to skip).
  bool answered = false;
  std::string payload;
  std::vector<c10::Storage> storages;

  uint8_t* data(size_t buffer) {
    if (buffer == 0) return reinterpret_cast<uint8_t*>(payload.data());
    return static_cast<uint8_t*>(storages[buffer - 1].data());
  }

  Received finish() {
    Received out;
    out.is_response = kind != FrameKind::kRequest;
    out.id = id;
    if (!refused.ok()) {
      out.result = refused;
      out.refused = true;
    } else if (kind == FrameKind::kError) {
      out.result = absl::Status(static_cast<absl::StatusCode>(code), payload);
    } else {
      Message message;
      message.type = type;
      message.id = id;
      message.payload = std::move(payload);
      message.storages = std::move(storages);
      out.result = std::move(message);
    }
    return out;
  }
};

Assembler::Assembler(uint64_t max_message_bytes, const MessageLimits& limits)
    : max_message_bytes_(max_message_bytes), limits_(limits) {}

Assembler::~Assembler() = default;

absl::Status Assembler::consume(const std::vector<::grpc::Slice>& slices,
                                std::vector<Received>& done,
                                const AuthHandler& on_auth) {
  Reader reader(slices);
  if (reader.remaining() == 0) return malformed("an empty gRPC message");
  while (reader.remaining() > 0) {
    uint8_t prefix[kPrefixBytes];
    if (!reader.read(prefix, kPrefixBytes)) {
      return malformed("a truncated frame prefix");
    }
    if (std::memcmp(prefix, kMagic, sizeof(kMagic)) != 0) {
      return malformed("bad magic");
    }
    const uint8_t kind = prefix[4];
    const uint8_t flags = prefix[5];
    const uint64_t body_bytes = get_le<uint64_t>(prefix + 8);
    if (get_le<uint16_t>(prefix + 6) != 0) {
      return malformed("reserved bytes set");
    }
    if (body_bytes > reader.remaining()) {
      return malformed(absl::StrCat("a frame body of ", body_bytes,
                                    " bytes where ", reader.remaining(),
                                    " are left"));
    }
    Reader body = reader.take(body_bytes);
    absl::Status status;
    if (kind == static_cast<uint8_t>(FrameKind::kAuth)) {
      if (flags != 0) return malformed("unknown flags");
      absl::StatusOr<AuthFrame> frame = read_auth(body);
      if (!frame.ok()) return frame.status();
      if (!on_auth) return malformed("an unexpected authentication frame");
      status = on_auth(*frame);
    } else if (!gate_.empty()) {
      return absl::UnauthenticatedError(gate_);
    } else if (kind == static_cast<uint8_t>(FrameKind::kChunk)) {
      if ((flags & ~kFlagResponse) != 0) return malformed("unknown flags");
      status = consume_chunk((flags & kFlagResponse) != 0, body, done);
    } else if (kind >= static_cast<uint8_t>(FrameKind::kRequest) &&
               kind <= static_cast<uint8_t>(FrameKind::kError)) {
      if (flags != 0) return malformed("unknown flags");
      status = consume_head(static_cast<FrameKind>(kind), body, done);
    } else {
      return malformed(absl::StrCat("unknown frame kind ", kind));
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<AuthFrame> Assembler::read_auth(Reader& body) {
  uint8_t fixed[8];
  if (!body.read(fixed, sizeof(fixed))) {
    return malformed("a truncated authentication frame");
  }
  const uint8_t step = fixed[0];
  if (step != static_cast<uint8_t>(AuthStep::kHello) &&
      step != static_cast<uint8_t>(AuthStep::kProof)) {
    return malformed(absl::StrCat("unknown authentication step ", step));
  }
  if (fixed[1] != 0 || get_le<uint16_t>(fixed + 2) != 0) {
    return malformed("reserved bytes set");
  }
  const uint32_t name_bytes = get_le<uint32_t>(fixed + 4);
  if (name_bytes > body.remaining() || name_bytes > kMaxAuthFieldBytes ||
      body.remaining() - name_bytes > kMaxAuthFieldBytes) {
    return malformed(absl::StrCat("an authentication frame of ",
                                  body.remaining(), " bytes with a name of ",
                                  name_bytes));
  }
  AuthFrame frame;
  frame.step = static_cast<AuthStep>(step);
  frame.name.resize(name_bytes);
  frame.data.resize(body.remaining() - name_bytes);
  body.read(frame.name.data(), frame.name.size());
  body.read(frame.data.data(), frame.data.size());
  return frame;
}

absl::Status Assembler::consume_head(FrameKind kind, Reader& body,
                                     std::vector<Received>& done) {
  uint8_t fixed[kHeadFixedBytes];
  if (!body.read(fixed, kHeadFixedBytes)) return malformed("a truncated head");
  auto partial = std::make_unique<Partial>();
  partial->kind = kind;
  partial->type = static_cast<MessageType>(get_le<int32_t>(fixed));
  partial->code = get_le<int32_t>(fixed + 4);
  partial->id = get_le<int64_t>(fixed + 8);
  const uint32_t count = get_le<uint32_t>(fixed + 16);
  if (get_le<uint32_t>(fixed + 20) != 0) return malformed("reserved bytes set");
  const bool is_error = kind == FrameKind::kError;
  if (is_error != (partial->code != 0) || partial->code < 0 ||
      partial->code > kMaxStatusCode) {
    return malformed(absl::StrCat("status code ", partial->code, " in a ",
                                  is_error ? "error" : "non-error", " head"));
  }
  if (count == 0 || count > kMaxStorages + 1 || (is_error && count != 1)) {
    return malformed(absl::StrCat(count, " buffers in a head"));
  }
  if (body.remaining() < 8 * static_cast<uint64_t>(count)) {
    return malformed("a truncated head");
  }
  uint64_t inline_bytes = 0;
  uint64_t total = 0;
  partial->sizes.resize(count);
  partial->inline_buffer.resize(count);
  partial->received.assign(count, 0);
  for (uint32_t i = 0; i < count; ++i) {
    uint8_t size[8];
    if (!body.read(size, 8)) return malformed("a truncated head");
    const uint64_t bytes = get_le<uint64_t>(size);
    // No agent sends more (it may not be configured to): a stranger's
    // numbers, which no skipping would ever see the end of. (Checked one
    // by one, the sum cannot overflow.)
    if (bytes > kMaxMessageLimit || total + bytes > kMaxMessageLimit) {
      return malformed(absl::StrCat(
          "a head announcing buffers of more than ", kMaxMessageLimit,
          " bytes in all (buffer ", i, " of ", bytes,
          " bytes), more than any sender may send"));
    }
    total += bytes;
    partial->sizes[i] = bytes;
    const bool fits = bytes <= kInlineLimit - inline_bytes;
    partial->inline_buffer[i] = fits;
    if (fits) inline_bytes += bytes;
  }
  const bool too_large = total > max_message_bytes_;
  if (body.remaining() != inline_bytes) {
    return malformed(absl::StrCat("a head with ", body.remaining(),
                                  " inline bytes where its sizes say ",
                                  inline_bytes));
  }
  const std::pair<bool, int64_t> key{kind != FrameKind::kRequest, partial->id};
  if (partial_.contains(key)) {
    return malformed(absl::StrCat("a second head for message ", partial->id));
  }
  absl::Status within = absl::OkStatus();
  if (!is_error) {
    within = check_message_limits(
        partial->sizes[0],
        absl::MakeConstSpan(partial->sizes).subspan(1), limits_);
  }
  if (too_large) {
    partial->refused = absl::ResourceExhaustedError(absl::StrCat(
        "a message of more than ", max_message_bytes_,
        " bytes, the receiver's limit (setting grpc.max_message_bytes)"));
  } else if (!within.ok()) {
    partial->refused = std::move(within);
  } else {
    try {
      partial->payload.resize(partial->sizes[0]);
      partial->storages.reserve(count - 1);
      for (uint32_t i = 1; i < count; ++i) {
        // Large ones reuse buffers that received earlier tensors.
        partial->storages.push_back(
            tether::internal::receive_storage(partial->sizes[i]));
      }
    } catch (const std::exception& e) {
      partial->payload.clear();
      partial->storages.clear();
      partial->refused = absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate a message of ", total, " bytes: ", e.what()));
    }
  }
  for (uint32_t i = 0; i < count; ++i) {
    if (!partial->inline_buffer[i] || partial->sizes[i] == 0) continue;
    const bool copied = partial->refused.ok()
                            ? body.read(partial->data(i), partial->sizes[i])
                            : body.skip(partial->sizes[i]);
    if (!copied) return malformed("a truncated head");
  }
  for (uint32_t i = 0; i < count; ++i) {
    if (!partial->inline_buffer[i]) partial->remaining += partial->sizes[i];
  }
  if (!partial->refused.ok()) {
    // Answered now: its sender learns at once, not once it has sent bytes
    // that are only skipped.
    done.push_back(partial->finish());
    partial->answered = true;
  }
  if (partial->remaining == 0) {
    if (!partial->answered) done.push_back(partial->finish());
  } else {
    partial_.emplace(key, std::move(partial));
  }
  return absl::OkStatus();
}

absl::Status Assembler::consume_chunk(bool is_response, Reader& body,
                                      std::vector<Received>& done) {
  uint8_t fixed[kChunkFixedBytes];
  if (!body.read(fixed, kChunkFixedBytes)) {
    return malformed("a truncated chunk");
  }
  const int64_t id = get_le<int64_t>(fixed);
  const uint32_t index = get_le<uint32_t>(fixed + 8);
  const uint64_t offset = get_le<uint64_t>(fixed + 16);
  if (get_le<uint32_t>(fixed + 12) != 0) return malformed("reserved bytes set");
  auto it = partial_.find(std::make_pair(is_response, id));
  if (it == partial_.end()) {
    return malformed(absl::StrCat("a chunk of message ", id,
                                  ", which has no head in progress"));
  }
  Partial& partial = *it->second;
  const uint64_t length = body.remaining();
  if (index >= partial.sizes.size() || partial.inline_buffer[index] ||
      offset != partial.received[index] || length == 0 ||
      length > partial.sizes[index] - offset) {
    return malformed(absl::StrCat("chunk [", offset, ", +", length,
                                  ") of buffer ", index, " of message ", id,
                                  " is out of order or out of range"));
  }
  const bool copied = partial.refused.ok()
                          ? body.read(partial.data(index) + offset, length)
                          : body.skip(length);
  if (!copied) return malformed("a truncated chunk");
  partial.received[index] += length;
  partial.remaining -= length;
  if (partial.remaining == 0) {
    if (!partial.answered) done.push_back(partial.finish());
    partial_.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace tether::backends::grpc::internal
