// The handshake of tether's TCP transport for TensorPipe (tcp_transport.h):
// the frames both ends exchange on a fresh connection before TensorPipe
// sees a single byte of it. Internal to the tensorpipe backend.
//
// Every frame: body size u32 (little-endian, 1..kMaxHandshakeFrameBytes),
// then the body: magic "tethertp" | version u8 | kind u8 | fields, where a
// string is its size u16 and its bytes:
//   kHello    has_secret u8 | name | challenge | proof
//   kProof    proof
//   kVerdict  accepted u8 | reason
// The body must be consumed exactly. Anything else is malformed: the
// connection is closed, and nothing past the frame's size is ever read or
// allocated.
//
// The exchange (client C connects to server S):
//   C -> S  kHello (C's name, C's challenge)
//   S -> C  kHello (S's name, S's challenge, S's proof for C's challenge)
//           or kVerdict refused (not a member, secret on one side only)
//   C -> S  kProof (C's proof for S's challenge)
//           or kVerdict refused (S's proof is wrong)
//   S -> C  kVerdict accepted, or refused (C's proof is wrong)
// Without a secret the challenges and proofs are empty; the exchange still
// checks the magic, the version and that both names belong to the group.
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_HANDSHAKE_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_HANDSHAKE_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace tether::backends::tensorpipe::internal {

// 2: frames inline up to 64 KiB (framing.h; 16 KiB in version 1, whose
// peers would refuse the larger ones as malformed). 3: mid-size storages as
// the pipe's payloads (framing.h, flag kPayloads, which version 2 refuses).
// 4: frames inline only up to 32 KiB (version 3 sends larger ones, which
// version 4 refuses as malformed). 5: up to 48 KiB (which version 4
// refuses). 6: express frames (tcp_transport.h), which version 5 takes for
// frames over its limit.
inline constexpr uint8_t kHandshakeVersion = 6;
inline constexpr size_t kMaxHandshakeFrameBytes = 4096;

enum class HandshakeKind : uint8_t { kHello = 1, kProof = 2, kVerdict = 3 };

struct HandshakeFrame {
  HandshakeKind kind = HandshakeKind::kHello;
  uint8_t version = kHandshakeVersion;
  // kHello.
  bool has_secret = false;
  std::string name;
  std::string challenge;
  // kHello (the server's) and kProof.
  std::string proof;
  // kVerdict.
  bool accepted = false;
  std::string reason;
};

// The frame with its size prefix. Strings longer than a u16 are cut (only
// reasons can be; names are checked against the limit by the caller).
std::string encode_handshake_frame(const HandshakeFrame& frame);

struct ParsedHandshakeFrame {
  HandshakeFrame frame;
  size_t consumed = 0;  // bytes of `input` the frame took
};

// The frame at the front of `input`: nullopt while it is incomplete,
// INVALID_ARGUMENT (saying what is wrong) when it is malformed. Never looks
// past kMaxHandshakeFrameBytes + 4 bytes.
absl::StatusOr<std::optional<ParsedHandshakeFrame>> parse_handshake_frame(
    absl::string_view input);

}  // namespace tether::backends::tensorpipe::internal

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_HANDSHAKE_H_
