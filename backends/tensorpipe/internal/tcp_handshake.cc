#include "backends/tensorpipe/internal/tcp_handshake.h"

#include <absl/status/status.h>
#include <absl/strings/escaping.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace tether::backends::tensorpipe::internal {
namespace {

constexpr char kMagic[] = "tethertp";
constexpr size_t kMagicBytes = sizeof(kMagic) - 1;

void put_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

void put_string(std::string& out, absl::string_view text) {
  const size_t size =
      std::min<size_t>(text.size(), std::numeric_limits<uint16_t>::max());
  out.push_back(static_cast<char>(size & 0xff));
  out.push_back(static_cast<char>(size >> 8));
  out.append(text.data(), size);
}

// Reads the body of one frame, bounds-checked.
class Reader {
 public:
  explicit Reader(absl::string_view body) : body_(body) {}

  bool byte(uint8_t* out) {
    if (body_.empty()) return false;
    *out = static_cast<uint8_t>(body_[0]);
    body_.remove_prefix(1);
    return true;
  }
  bool string(std::string* out) {
    if (body_.size() < 2) return false;
    const size_t size = static_cast<uint8_t>(body_[0]) |
                        (static_cast<size_t>(static_cast<uint8_t>(body_[1]))
                         << 8);
    body_.remove_prefix(2);
    if (body_.size() < size) return false;
    out->assign(body_.data(), size);
    body_.remove_prefix(size);
    return true;
  }
  bool done() const { return body_.empty(); }

 private:
  absl::string_view body_;
};

absl::Status malformed(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("a malformed handshake frame: ", why));
}

}  // namespace

std::string encode_handshake_frame(const HandshakeFrame& frame) {
  std::string body(kMagic, kMagicBytes);
  body.push_back(static_cast<char>(frame.version));
  body.push_back(static_cast<char>(frame.kind));
  switch (frame.kind) {
    case HandshakeKind::kHello:
      body.push_back(frame.has_secret ? 1 : 0);
      put_string(body, frame.name);
      put_string(body, frame.challenge);
      put_string(body, frame.proof);
      break;
    case HandshakeKind::kProof:
      put_string(body, frame.proof);
      break;
    case HandshakeKind::kVerdict:
      body.push_back(frame.accepted ? 1 : 0);
      put_string(body, frame.reason.substr(
                           0, kMaxHandshakeFrameBytes - kMagicBytes - 5));
      break;
  }
  std::string out;
  put_u32(out, static_cast<uint32_t>(body.size()));
  out += body;
  return out;
}

absl::StatusOr<std::optional<ParsedHandshakeFrame>> parse_handshake_frame(
    absl::string_view input) {
  if (input.size() < 4) return std::nullopt;
  uint32_t size = 0;
  for (int i = 0; i < 4; ++i) {
    size |= static_cast<uint32_t>(static_cast<uint8_t>(input[i])) << (8 * i);
  }
  if (size == 0 || size > kMaxHandshakeFrameBytes) {
    return malformed(absl::StrCat("announces ", size, " bytes (at most ",
                                  kMaxHandshakeFrameBytes, ")"));
  }
  // The magic is checked as soon as it has arrived, so that a stranger's
  // bytes are refused without waiting for a whole frame.
  const absl::string_view head =
      input.substr(4, std::min<size_t>(size, kMagicBytes));
  if (std::memcmp(head.data(), kMagic, head.size()) != 0) {
    return malformed(absl::StrCat("not tether's magic (starts with \"",
                                  absl::CHexEscape(head), "\")"));
  }
  if (input.size() - 4 < size) return std::nullopt;
  if (size < kMagicBytes + 2) return malformed("too short");
  Reader reader(input.substr(4 + kMagicBytes, size - kMagicBytes));
  ParsedHandshakeFrame parsed;
  parsed.consumed = 4 + size;
  HandshakeFrame& frame = parsed.frame;
  uint8_t kind = 0;
  reader.byte(&frame.version);
  reader.byte(&kind);
  if (frame.version != kHandshakeVersion) {
    // Still a frame: the caller refuses it by name.
    return parsed;
  }
  uint8_t flag = 0;
  bool ok = false;
  switch (static_cast<HandshakeKind>(kind)) {
    case HandshakeKind::kHello:
      frame.kind = HandshakeKind::kHello;
      ok = reader.byte(&flag) && flag <= 1 && reader.string(&frame.name) &&
           reader.string(&frame.challenge) && reader.string(&frame.proof);
      frame.has_secret = flag == 1;
      break;
    case HandshakeKind::kProof:
      frame.kind = HandshakeKind::kProof;
      ok = reader.string(&frame.proof);
      break;
    case HandshakeKind::kVerdict:
      frame.kind = HandshakeKind::kVerdict;
      ok = reader.byte(&flag) && flag <= 1 && reader.string(&frame.reason);
      frame.accepted = flag == 1;
      break;
    default:
      return malformed(absl::StrCat("unknown kind ", kind));
  }
  if (!ok) return malformed("fields do not fit its size");
  if (!reader.done()) return malformed("bytes left over after its fields");
  return parsed;
}

}  // namespace tether::backends::tensorpipe::internal
