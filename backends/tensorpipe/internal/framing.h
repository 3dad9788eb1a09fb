// Framing of tether Messages over tensorpipe Messages (internal to the
// tensorpipe backend).
//
// One tether request or response is one tensorpipe::Message (or, when it
// is inline, one express frame with the same bytes: below):
//   - `metadata` is a small fixed header (below), little-endian;
//   - the Message's payload bytes, if any, are tensorpipe payload 0 (sent
//     from the Message's own string, no copy);
//   - each non-empty storage is a tensorpipe tensor (a CPU buffer pointing at
//     the storage's bytes); empty storages travel only as a size of 0 in the
//     header, so zero-length buffers never reach a channel.
//
// Header: "TPF1" | kind u8 | flags u8 | 2 zero bytes | MessageType i32
//         | status code i32 | id i64 | payload size u64 | storage count u32
//         | count x u64 sizes
//
// Small messages (payload at most kInlineLimit bytes, and storages together
// at most kInlineLimit bytes) set flag kInline and carry the payload and then every storage's bytes in
// the metadata, after the header, with no tensorpipe payload or tensor: the
// peer gets the whole message in the descriptor, saving a read (and, on the
// uv transport, a loop round trip) per message; the copy is cheaper than
// that round trip for messages this small.
//
// Mid-size messages (not inline, storages together at most kPayloadLimit
// bytes) set flag kPayloads: each non-empty storage is a tensorpipe
// payload after payload 0 (present, as always, only when the payload is
// not empty), read from the pipe's own connection straight into the
// storage, and no tensor. Through a channel (cma) each direction pays the
// channel's own descriptor and its thread's hand-offs, which cost more
// than the bytes at these sizes (docs/decisions.md, "Mid-size messages on
// the tensorpipe backend").
//
// An error response (the handler's future failed) has kind kError, the
// absl::StatusCode, and the status message as its payload.
//
// Authentication (core/auth) uses frames of kind kAuth, always inline, whose
// payload is: step u8 | name size u32 | name | data. The steps: kHello
// (the sender's name and its challenge), kProof (the answer to the peer's
// challenge), kRefused (why the connection is refused, as text).
//
// Express frames (tcp_transport.h): an inline frame may also travel as one
// express frame on the pipe's own tcp connection, skipping the pipe; its
// bytes are the descriptor's metadata it would have had. A client binds
// its pipe's connection to the pipe first: a kBind frame with a random
// nonce as an express frame, then one on the pipe; the server, which has
// seen both (the express frame first: it comes first on the connection),
// links the connection to the pipe, so that it can answer an express
// request too large for an express answer on the pipe, and says so with a
// kBindAck carrying the nonce (0: not bound) on the pipe. Only then does
// the client send express requests. Bind frames are inline, with an 8-byte
// payload and no storages.
//
// Ownership: an OutgoingFrame owns everything its tensorpipe::Message points
// into; keep it alive until the write callback. An IncomingFrame owns the
// buffers its Allocation points into; keep it alive until the read callback.
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_FRAMING_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_FRAMING_H_

#include <absl/container/inlined_vector.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <c10/core/Storage.h>
#include <tensorpipe/core/message.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/tensorpipe/internal/discard_region.h"
#include "core/message.h"

namespace tether::backends::tensorpipe::internal {

enum class FrameKind : uint8_t {
  kRequest = 1,
  kResponse = 2,
  kError = 3,
  kAuth = 4,
  // Binding a pipe's connection for express frames: payload u64 nonce.
  kBind = 5,
  kBindAck = 6,
};

enum class AuthStep : uint8_t {
  kHello = 1,
  kProof = 2,
  kRefused = 3,
};

struct AuthFrame {
  AuthStep step = AuthStep::kHello;
  std::string name;
  std::string data;
};

// A payload up to this many bytes, with storages together up to as many,
// travels inline. 48 KiB: an inline frame's bytes are copied seven times a
// side (into the metadata, four times inside TensorPipe's pipe, twice on
// receipt), which costs more than the payloads' second read from about 48
// KiB: a 64 KiB echo as payloads took 8 to 15 % less than inline, a 36 KB
// call 15 % more, a 48 KB one the same (docs/decisions.md, "Mid-size
// messages on the tensorpipe backend").
constexpr uint64_t kInlineLimit = 48 << 10;

// Storages together up to this many bytes, over the inline limit, travel as
// the pipe's payloads; larger ones through a channel, whose single copy
// from the sender's memory is faster from about 1 MiB (docs/decisions.md,
// "Mid-size messages on the tensorpipe backend").
constexpr uint64_t kPayloadLimit = 256 << 10;

struct FrameHeader {
  FrameKind kind = FrameKind::kRequest;
  // Payload and storages follow the header in the metadata.
  bool inline_data = false;
  // Flag kPayloads: the non-empty storages are tensorpipe payloads after
  // the payload's own, not tensors.
  bool storages_as_payloads = false;
  MessageType type = MessageType::kUnknown;
  int64_t id = -1;
  // Only for kError; 0 otherwise.
  int32_t code = 0;
  uint64_t payload_size = 0;
  // Inline up to two: a small call's frame allocates nothing for them.
  absl::InlinedVector<uint64_t, 2> storage_sizes;
};

// Bounds on what a peer may announce; more is a protocol error.
constexpr uint32_t kMaxStorages = 1 << 20;

// `room`: bytes the caller appends after it (an inline frame's data), so
// that the string is allocated once.
std::string encode_header(const FrameHeader& header, size_t room = 0);

// The size of the header encode_header() writes for `header`.
size_t header_size(const FrameHeader& header);

// INVALID_ARGUMENT when `metadata` is not a well-formed header (with, for an
// inline frame, exactly the announced bytes after it).
[[nodiscard]] absl::StatusOr<FrameHeader> decode_header(
    absl::string_view metadata);

struct OutgoingFrame {
  FrameHeader header;
  std::string payload;
  std::vector<c10::Storage> storages;

  // A message pointing into this frame's payload and storages.
  ::tensorpipe::Message to_tensorpipe() const;
};

std::shared_ptr<OutgoingFrame> make_request_frame(Message request);
// `id` is the request's; an error result becomes a kError frame.
std::shared_ptr<OutgoingFrame> make_response_frame(
    int64_t id, const absl::StatusOr<Message>& result);

std::shared_ptr<OutgoingFrame> make_auth_frame(const AuthFrame& auth);
// kind: kBind or kBindAck.
std::shared_ptr<OutgoingFrame> make_bind_frame(FrameKind kind, uint64_t nonce);

struct IncomingFrame {
  FrameHeader header;
  std::string payload;
  std::vector<c10::Storage> storages;
  // Not OK when this side refused the message (RESOURCE_EXHAUSTED, over the
  // limits): its bytes are read into `discard` and dropped.
  absl::Status refused;
  std::unique_ptr<DiscardRegion> discard;
  // Points into `payload` and `storages` (or `discard`); pass it to
  // Pipe::read().
  ::tensorpipe::Allocation allocation;

  // After the read: the request or response it carries, the error status of
  // a kError frame, or `refused`.
  absl::StatusOr<Message> take_result();
  // After the read, for a kAuth frame: its contents (INVALID_ARGUMENT if
  // malformed).
  absl::StatusOr<AuthFrame> take_auth() const;
  // For a kBind or kBindAck frame: its nonce.
  uint64_t take_nonce() const;
  // After a failed read: the storages a channel was receiving are never
  // reused (core/toolkit/receive_buffers.h, quarantine_receive_storage):
  // the peer's process may still write into them (cma_write_channel.h).
  void quarantine();
};

// Checks `descriptor` against its header (counts, sizes, CPU only) and
// `limits`, and allocates the payload and one storage per announced size.
// Shared, as the pipe's read callback holds it (one allocation with its
// count).
// A request or response over `limits` (checked before allocating) is not an
// error: its frame is `refused` with the RESOURCE_EXHAUSTED of
// check_message_limits() and reads its bytes into a DiscardRegion, so that
// the pipe goes on to the next message. Errors, after which the pipe cannot
// be used: INVALID_ARGUMENT for a malformed or inconsistent frame,
// RESOURCE_EXHAUSTED when the memory (or the discard region) cannot be had,
// or for an error or authentication frame over the payload limit.
[[nodiscard]] absl::StatusOr<std::shared_ptr<IncomingFrame>> allocate_frame(
    const ::tensorpipe::Descriptor& descriptor,
    const MessageLimits& limits = MessageLimits());

// An express frame's bytes: checked as allocate_frame() checks a
// descriptor's, and only inline frames are; the frame holds its data.
[[nodiscard]] absl::StatusOr<std::shared_ptr<IncomingFrame>>
allocate_express_frame(absl::string_view bytes,
                       const MessageLimits& limits = MessageLimits());

}  // namespace tether::backends::tensorpipe::internal

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_FRAMING_H_
