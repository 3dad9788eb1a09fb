// The libfabric agent's wire protocol: frames, message bodies, tags and
// chunks (internal to the libfabric backend). No libfabric calls here: the
// encoders and decoders are plain functions, tested on their own.
//
// Every eager message is one frame in one of the receiver's pre-posted
// buffers, sent with the tag kEagerTag:
//
//   FrameHeader (40 bytes, little-endian):
//     "TLF1" | kind u8 | flags u8 | credits u16 | src rank u32 | 0 u32
//     | arg0 u64 | arg1 u64 | arg2 u64
//
// `credits` returns that many of the receiver's credits (flow control: the
// sender of the frame has consumed and re-posted that many of the
// receiver's frames); the flags say whether the frame uses the receiver's
// reserved control slot instead of a credit, and whether it hands back the
// control slot the receiver used at its sender.
//
// A frame that carries a tether Message (request, response, error) goes on
// with a MessageHead (40 bytes: type i32 | code i32 | id i64 | body size
// u64 | body address u64 | body key u64), its args being (transfer id, tag
// sequence base, chunk size), and then the body, inline unless the frame
// says the body is remote (too large for the buffer: the receiver pulls it
// first, at the body address and key). The body lists the message's
// segments (segment 0 is the payload, segment i + 1 storage i):
//
//   count u32 | count x (remote u8 | size u64 [| address u64 | key u64])
//   | the bytes of the inline segments, in order
//
// A remote segment is pulled by the receiver: with fi_read from the given
// address and key, or, when the receiver moves bulk data by tagged messages
// (no FI_RMA), by receives it posts with bulk_tag(sender, sequence base +
// chunk index) before it tells the sender to send them (kClearToSend).
// Chunks of at most the message's chunk size cut the remote body first,
// then the remote segments, in order; both sides number them alike
// (plan_chunks()).
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_FRAMING_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_FRAMING_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/message.h"

namespace tether::backends::libfabric::internal {

enum class FrameKind : uint8_t {
  // Carry a Message: a request, its response, or its error (code, text).
  kRequest = 1,
  kResponse = 2,
  kError = 3,
  // arg0 = transfer: the receiver is done with the sender's transfer (it
  // pulled it, or gave up): the sender may release its buffers.
  kRelease = 4,
  // arg0 = transfer, arg1 = first chunk, arg2 = chunk count: the receiver
  // has posted receives for these chunks; send them (tagged bulk mode).
  kClearToSend = 5,
  // Liveness: a keepalive asks for any frame back; the ack is one.
  kKeepalive = 6,
  kKeepaliveAck = 7,
  // Only returns credits (in the header).
  kCredit = 8,
  // The sender shuts down: fail what waits for it.
  kGoodbye = 9,
  // A step of the authentication handshake (AgentSetup::auth); the tail is
  // an AuthFrame (write_auth()).
  kAuth = 10,
};

inline bool carries_message(FrameKind kind) {
  return kind == FrameKind::kRequest || kind == FrameKind::kResponse ||
         kind == FrameKind::kError;
}

// Header flags.
constexpr uint8_t kFlagControlSlot = 1;
constexpr uint8_t kFlagReturnsControlSlot = 2;
constexpr uint8_t kFlagBodyRemote = 4;

constexpr size_t kHeaderSize = 40;
constexpr size_t kMessageHeadSize = 40;

// Tags: eager frames match the receiver's pool of buffers; bulk chunks
// match one posted receive each.
constexpr uint64_t kEagerTag = uint64_t{1} << 60;
constexpr uint64_t kEagerIgnore = kEagerTag - 1;
constexpr uint32_t kMaxRanks = uint32_t{1} << 20;
constexpr uint64_t kSequenceMask = (uint64_t{1} << 40) - 1;
uint64_t bulk_tag(uint32_t rank, uint64_t sequence);

// Bounds on what a peer may announce; more is a protocol error.
constexpr uint32_t kMaxSegments = (uint32_t{1} << 20) + 1;
constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;
constexpr uint64_t kMaxChunks = uint64_t{1} << 24;
// A peer announcing smaller chunks is refused: tiny chunks would make a
// message within the limits plan millions of them.
constexpr uint64_t kMinChunkSize = 4096;

struct FrameHeader {
  FrameKind kind = FrameKind::kCredit;
  uint8_t flags = 0;
  uint16_t credits = 0;
  uint32_t src_rank = 0;
  uint64_t arg0 = 0;
  uint64_t arg1 = 0;
  uint64_t arg2 = 0;
};

struct MessageHead {
  MessageType type = MessageType::kUnknown;
  // An absl::StatusCode for kError frames, else 0.
  int32_t code = 0;
  int64_t id = -1;
  uint64_t body_size = 0;
  // Where to pull a remote body from (kFlagBodyRemote).
  uint64_t body_address = 0;
  uint64_t body_key = 0;
};

struct SegmentDesc {
  uint64_t size = 0;
  bool remote = false;
  uint64_t address = 0;
  uint64_t key = 0;
};

// Authentication, per ordered peer pair: the worker that sends
// requests (the client) proves itself to the one that serves them (the
// server) and the other way round, before the server accepts any request
// and before the client accepts any response. The exchange is
// core/auth/handshake.h's 4-step shape; these frames are its envelope:
//
//   client -> server  kClientHello  name, client challenge
//   server -> client  kServerHello  name, server challenge
//   client -> server  kClientProof  name, client's proof
//   server -> client  kServerProof  name, server's proof
//                     (or kRefused at any point, the reason in `proof`)
//
// Proofs are core/auth's HMACs, bound to both names, roles and challenges.
// The client sends its requests only once the server has proved itself
// (which it does only after verifying the client), so the provider's
// message ordering does not matter. The step says which side's handshake
// a frame is for (each worker is client and server of each peer).
enum class AuthStep : uint8_t {
  kClientHello = 1,
  kServerHello = 2,
  kClientProof = 3,
  kServerProof = 4,
  kRefused = 5,
};

// step u8 | name size u16 | challenge size u16 | proof size u16 | name
// | challenge | proof; each field at most kMaxAuthField bytes.
struct AuthFrame {
  AuthStep step = AuthStep::kClientHello;
  std::string name;
  std::string challenge;
  std::string proof;  // the refusal's reason for kRefused
};
constexpr size_t kMaxAuthField = 512;

// Longer fields are cut to kMaxAuthField bytes (a refusal's reason; names
// and HMACs are shorter).
std::string write_auth(const AuthFrame& frame);
// INVALID_ARGUMENT unless `tail` is exactly one well-formed AuthFrame.
[[nodiscard]] absl::StatusOr<AuthFrame> read_auth(absl::string_view tail);

// Writes exactly kHeaderSize bytes.
void write_header(const FrameHeader& header, char* out);
// INVALID_ARGUMENT unless `frame` starts with a well-formed header.
[[nodiscard]] absl::StatusOr<FrameHeader> read_header(absl::string_view frame);

// Writes exactly kMessageHeadSize bytes.
void write_message_head(const MessageHead& head, char* out);
[[nodiscard]] absl::StatusOr<MessageHead> read_message_head(
    absl::string_view bytes);

// The encoded size of a body with these segments, inline bytes included.
size_t body_size(const std::vector<SegmentDesc>& segments);

// Writes body_size(segments) bytes; `inline_data[i]` points at segment i's
// bytes when it is inline and non-empty (ignored otherwise).
void write_body(const std::vector<SegmentDesc>& segments,
                const std::vector<const char*>& inline_data, char* out);

struct Body {
  std::vector<SegmentDesc> segments;
  // Per segment, its bytes inside the decoded buffer when inline (else
  // nullptr); valid as long as that buffer.
  std::vector<const char*> inline_data;
};

// INVALID_ARGUMENT for a malformed body (counts, sizes, or inline bytes
// that do not add up to exactly `bytes`).
[[nodiscard]] absl::StatusOr<Body> read_body(absl::string_view bytes);

// RESOURCE_EXHAUSTED, naming the limit, when `body` announces more than
// `limits` allow (payload bytes, storages, storage bytes); checked before
// anything is allocated for it.
[[nodiscard]] absl::Status check_limits(const Body& body,
                                        const MessageLimits& limits);
// The largest encoded body a message within `limits` can have: a remote
// body announced larger is refused before it is allocated.
uint64_t max_body_size(const MessageLimits& limits);

// One piece of a remote transfer: of the body (segment == kBodySegment) or
// of segment `segment`.
constexpr uint32_t kBodySegment = ~uint32_t{0};
struct Chunk {
  uint32_t segment = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Appends the chunks of a remote body of `body_size` bytes, and
// plan_chunks() those of the remote segments, in order. INVALID_ARGUMENT
// when `out` would exceed kMaxChunks or chunk_size is 0.
[[nodiscard]] absl::Status plan_body_chunks(uint64_t body_size,
                                            uint64_t chunk_size,
                                            std::vector<Chunk>& out);
[[nodiscard]] absl::Status plan_chunks(
    const std::vector<SegmentDesc>& segments, uint64_t chunk_size,
    std::vector<Chunk>& out);

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_FRAMING_H_
