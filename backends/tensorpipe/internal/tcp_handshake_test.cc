#include "backends/tensorpipe/internal/tcp_handshake.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "testing/status_matchers.h"

namespace tether::backends::tensorpipe::internal {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

TEST(TcpHandshake, FramesRoundTrip) {
  HandshakeFrame hello;
  hello.kind = HandshakeKind::kHello;
  hello.has_secret = true;
  hello.name = "w0";
  hello.challenge = std::string(32, 'c');
  hello.proof = std::string(32, 'p');
  HandshakeFrame verdict;
  verdict.kind = HandshakeKind::kVerdict;
  verdict.reason = "no";
  const std::string bytes =
      encode_handshake_frame(hello) + encode_handshake_frame(verdict);
  auto first = parse_handshake_frame(bytes);
  ASSERT_THAT(first, IsOk());
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->frame.name, "w0");
  EXPECT_TRUE((*first)->frame.has_secret);
  EXPECT_EQ((*first)->frame.challenge, hello.challenge);
  EXPECT_EQ((*first)->frame.proof, hello.proof);
  auto second =
      parse_handshake_frame(absl::string_view(bytes).substr((*first)->consumed));
  ASSERT_THAT(second, IsOk());
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ((*second)->frame.kind, HandshakeKind::kVerdict);
  EXPECT_FALSE((*second)->frame.accepted);
  EXPECT_EQ((*second)->frame.reason, "no");
}

TEST(TcpHandshake, IncompleteFramesWait) {
  HandshakeFrame proof;
  proof.kind = HandshakeKind::kProof;
  proof.proof = "abc";
  const std::string bytes = encode_handshake_frame(proof);
  for (size_t size = 0; size < bytes.size(); ++size) {
    auto parsed = parse_handshake_frame(bytes.substr(0, size));
    ASSERT_THAT(parsed, IsOk()) << size;
    EXPECT_FALSE(parsed->has_value()) << size;
  }
}

TEST(TcpHandshake, StrangersBytesAreRefusedAtOnce) {
  EXPECT_THAT(parse_handshake_frame(std::string(16, '\xff')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("announces 4294967295 bytes")));
  EXPECT_THAT(parse_handshake_frame(std::string(4, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A plausible size, then not the magic: refused before the frame is
  // complete.
  const std::string http("\x10\x00\x00\x00GET / HTTP/1.1", 18);
  EXPECT_THAT(parse_handshake_frame(http),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not tether's magic")));
}

TEST(TcpHandshake, FieldsMustFitTheFrame) {
  HandshakeFrame hello;
  hello.name = "w1";
  std::string bytes = encode_handshake_frame(hello);
  // Make the name's size run past the frame.
  const size_t name_size_at = 4 + 8 + 2 + 1;
  bytes[name_size_at] = '\x7f';
  EXPECT_THAT(parse_handshake_frame(bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("do not fit")));
  // Bytes left over.
  std::string longer = encode_handshake_frame(hello);
  longer[0] = static_cast<char>(longer[0] + 1);
  longer.push_back('x');
  EXPECT_THAT(parse_handshake_frame(longer),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("left over")));
}

// Every mutation of valid frames parses or is refused: never a crash, never
// a read past the input (ASan builds check that).
TEST(TcpHandshake, MutatedFramesNeverCrash) {
  HandshakeFrame hello;
  hello.has_secret = true;
  hello.name = "worker";
  hello.challenge = std::string(32, 'c');
  const std::string valid = encode_handshake_frame(hello);
  std::mt19937 random(7);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = valid.substr(0, random() % (valid.size() + 1));
    for (int flips = random() % 4; flips > 0 && !bytes.empty(); --flips) {
      bytes[random() % bytes.size()] = static_cast<char>(random());
    }
    (void)parse_handshake_frame(bytes);
  }
}

}  // namespace
}  // namespace tether::backends::tensorpipe::internal
