// Framing of tether Messages on a gRPC byte stream (internal to the gRPC
// backend).
//
// The agent's bidirectional stream carries gRPC messages (ByteBuffers) that
// are each a run of frames, back to back. A tether request or response is
// one head frame and, for the buffers too large to ride in the head, chunk
// frames. A message's buffers are its payload (buffer 0) and its storages
// (buffers 1..n).
//
// Every frame starts with a 16-byte prefix, little-endian:
//   "TGF1" | kind u8 | flags u8 | 2 zero bytes | body size u64
// Head (kind request 1, response 2, error 3):
//   MessageType i32 | status code i32 | id i64 | buffer count u32 | 4 zero
//   bytes | count x u64 buffer sizes | the inline buffers' bytes
// Chunk (kind 4; flag 1 set when it belongs to a response or an error):
//   id i64 | buffer index u32 | 4 zero bytes | offset u64 | the bytes
//
// Which buffers are inline follows from their sizes, so both sides compute
// it: in order, a buffer is inline while the inline bytes stay within
// kInlineLimit. The others are sent in chunks of at most `chunk_bytes`, in
// order, each chunk a gRPC slice that references the storage (no copy on
// send; the slice holds the message until gRPC is done with it). A writer
// takes frames round robin from the messages it has queued, so a small
// message waits at most for one chunk of a large one.
//
// An error response carries the absl::StatusCode and, as its payload, the
// status message.
//
// A head whose buffers add up to more than kMaxMessageLimit (2^40, the
// highest grpc.max_message_bytes) is malformed: no agent sends one, and a
// message that big could never be skipped to its end. A head over the
// receiver's own limit is refused at once (its result is given with the
// head) and its chunks are skipped as they come.
//
// Authentication (kind 5), when the workers share a secret (core/auth): the
// first frames each side sends on a stream, before any message:
//   step u8 (1 hello, 2 proof) | 3 zero bytes | name size u32 | the sender's
//   worker name | data (hello: the sender's challenge; proof: its HMAC)
// An Assembler with a closed gate (close_gate()) refuses any other frame
// until the agent opens it, before allocating anything for it.
//
// Ownership: an OutgoingMessage is immutable once made and shared with the
// slices that point into it. An Assembler owns the messages it is building.
//
// Thread safety: OutgoingCursor and Assembler are thread-compatible (the
// agent moves a stream's cursors under the stream's lock, and feeds its
// Assembler from the stream's read callbacks, which gRPC runs one at a
// time).
#ifndef TETHER_BACKENDS_GRPC_INTERNAL_FRAMING_H_
#define TETHER_BACKENDS_GRPC_INTERNAL_FRAMING_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/message.h"

namespace tether::backends::grpc::internal {

enum class FrameKind : uint8_t {
  kRequest = 1,
  kResponse = 2,
  kError = 3,
  kChunk = 4,
  kAuth = 5,
};

enum class AuthStep : uint8_t {
  kHello = 1,
  kProof = 2,
};

struct AuthFrame {
  AuthStep step = AuthStep::kHello;
  std::string name;
  std::string data;
};

// The longest name and data an authentication frame may carry.
inline constexpr size_t kMaxAuthFieldBytes = 4096;

// Buffers up to this many bytes in all ride in the head frame (copied: a
// copy this small costs less than a slice of its own).
inline constexpr uint64_t kInlineLimit = 16 << 10;
// Storages per message, as the wire codec's default limit.
inline constexpr uint32_t kMaxStorages = 1 << 16;
inline constexpr size_t kPrefixBytes = 16;
inline constexpr size_t kHeadFixedBytes = 24;
inline constexpr size_t kChunkFixedBytes = 24;

// The largest head frame: what a gRPC message must be allowed beyond the
// chunks it carries.
inline constexpr size_t kMaxHeadFrameBytes = kPrefixBytes + kHeadFixedBytes +
                                             8 * (size_t{kMaxStorages} + 1) +
                                             kInlineLimit;

// A message to send, immutable once made.
struct OutgoingMessage {
  FrameKind kind = FrameKind::kRequest;
  MessageType type = MessageType::kUnknown;
  int32_t code = 0;  // kError only
  int64_t id = -1;
  std::string payload;
  std::vector<c10::Storage> storages;
  // Derived: buffer sizes (payload first) and which are inline.
  std::vector<uint64_t> sizes;
  std::vector<bool> inline_buffer;
  uint64_t inline_bytes = 0;

  // Payload and storages together.
  uint64_t total_bytes() const;
};

// A request (`message.id` set by the agent) or a response to request `id`;
// an error result becomes an error message.
std::shared_ptr<const OutgoingMessage> make_request(Message message);
std::shared_ptr<const OutgoingMessage> make_response(
    int64_t id, const absl::StatusOr<Message>& result);

// RESOURCE_EXHAUSTED when `message` may not be sent: more than
// `max_message_bytes` in its payload and storages, or more than kMaxStorages
// storages. `what` names it in the error.
[[nodiscard]] absl::Status check_limits(const OutgoingMessage& message,
                                        uint64_t max_message_bytes,
                                        absl::string_view what);

// The frame of one authentication step.
::grpc::Slice make_auth_frame(const AuthFrame& frame);

// Walks the frames of one message.
class OutgoingCursor {
 public:
  explicit OutgoingCursor(std::shared_ptr<const OutgoingMessage> message)
      : message_(std::move(message)) {}

  // Appends the next frame's slices to `out` and returns its size in bytes.
  // Only while !done().
  size_t append_next_frame(size_t chunk_bytes, std::vector<::grpc::Slice>& out);

  bool done() const { return done_; }
  const OutgoingMessage& message() const { return *message_; }
  const std::shared_ptr<const OutgoingMessage>& shared_message() const {
    return message_;
  }

 private:
  // Moves to the next chunked buffer with bytes left (done_ if none).
  void skip_to_chunked();

  std::shared_ptr<const OutgoingMessage> message_;
  bool head_sent_ = false;
  bool done_ = false;
  size_t buffer_ = 0;
  uint64_t offset_ = 0;
};

// A message received whole.
struct Received {
  // Of a response or error (else of a request: the peer's id space).
  bool is_response = false;
  int64_t id = -1;
  // A request or response; the status of an error message; or
  // RESOURCE_EXHAUSTED if this side refused it (over the limits, or no
  // memory), given as soon as its head came: its bytes are skipped as they
  // come.
  absl::StatusOr<Message> result;
  // This side refused it (`result` says why).
  bool refused = false;
};

// Rebuilds messages from the frames of one stream, in the order they come.
class Assembler {
 public:
  // Large received storages reuse the buffers of freed ones
  // (core/toolkit/receive_buffers.h). A request or response over
  // `max_message_bytes` or `limits` (AgentSetup::limits) is refused: it is
  // delivered as RESOURCE_EXHAUSTED naming the limit, and its bytes are
  // skipped as they come, never held.
  explicit Assembler(uint64_t max_message_bytes,
                     const MessageLimits& limits = MessageLimits());
  ~Assembler();
  Assembler(const Assembler&) = delete;
  Assembler& operator=(const Assembler&) = delete;

  // Called with each authentication frame, in stream order (it may open the
  // gate for the frames after it); an error stops consume() with it.
  using AuthHandler = std::function<absl::Status(const AuthFrame&)>;

  // Consumes the frames of one gRPC message and appends the messages they
  // complete to `done`. INVALID_ARGUMENT when the bytes break the protocol
  // (an authentication frame without `on_auth` included): the stream cannot
  // be trusted after that. UNAUTHENTICATED (the gate's reason) for a frame
  // other than authentication while the gate is closed, or whatever
  // `on_auth` returned.
  [[nodiscard]] absl::Status consume(const std::vector<::grpc::Slice>& slices,
                                     std::vector<Received>& done,
                                     const AuthHandler& on_auth = nullptr);

  // Until open_gate(), only authentication frames pass; any other is
  // refused with UNAUTHENTICATED and `why`.
  void close_gate(std::string why) { gate_ = std::move(why); }
  void open_gate() { gate_.clear(); }

  // Messages begun and not yet complete.
  size_t partial() const { return partial_.size(); }

 private:
  struct Partial;
  class Reader;

  static absl::StatusOr<AuthFrame> read_auth(Reader& body);
  absl::Status consume_head(FrameKind kind, Reader& body,
                            std::vector<Received>& done);
  absl::Status consume_chunk(bool is_response, Reader& body,
                             std::vector<Received>& done);

  const uint64_t max_message_bytes_;
  const MessageLimits limits_;
  // Not empty while the gate is closed: why.
  std::string gate_;
  // Keyed by (is_response, id).
  absl::flat_hash_map<std::pair<bool, int64_t>, std::unique_ptr<Partial>>
      partial_;
};

}  // namespace tether::backends::grpc::internal

#endif  // TETHER_BACKENDS_GRPC_INTERNAL_FRAMING_H_
