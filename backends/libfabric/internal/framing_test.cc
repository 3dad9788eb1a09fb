#include "backends/libfabric/internal/framing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::backends::libfabric::internal {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

std::string header_bytes(const FrameHeader& header) {
  std::string out(kHeaderSize, '\0');
  write_header(header, out.data());
  return out;
}

std::string body_bytes(const std::vector<SegmentDesc>& segments,
                       const std::vector<std::string>& data) {
  std::vector<const char*> pointers;
  for (const std::string& bytes : data) pointers.push_back(bytes.data());
  std::string out(body_size(segments), '\0');
  write_body(segments, pointers, out.data());
  return out;
}

TEST(Frame, HeaderRoundTrips) {
  FrameHeader header;
  header.kind = FrameKind::kClearToSend;
  header.flags = kFlagControlSlot | kFlagReturnsControlSlot;
  header.credits = 7;
  header.src_rank = 12345;
  header.arg0 = 1;
  header.arg1 = ~uint64_t{0};
  header.arg2 = 3;
  absl::StatusOr<FrameHeader> read = read_header(header_bytes(header));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->kind, FrameKind::kClearToSend);
  EXPECT_EQ(read->flags, header.flags);
  EXPECT_EQ(read->credits, 7);
  EXPECT_EQ(read->src_rank, 12345u);
  EXPECT_EQ(read->arg1, ~uint64_t{0});
}

TEST(Frame, MalformedHeadersAreInvalidArgument) {
  FrameHeader header;
  header.kind = FrameKind::kRequest;
  const std::string good = header_bytes(header);
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  std::string bad_kind = good;
  bad_kind[4] = 42;
  std::string bad_flags = good;
  bad_flags[5] = static_cast<char>(0x80);
  std::string reserved = good;
  reserved[12] = 1;
  FrameHeader control;
  control.kind = FrameKind::kCredit;
  control.flags = kFlagBodyRemote;
  for (const std::string& bytes :
       {good.substr(0, kHeaderSize - 1), bad_magic, bad_kind, bad_flags,
        reserved, header_bytes(control)}) {
    EXPECT_THAT(read_header(bytes),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("malformed libfabric frame")));
  }
}

TEST(Frame, MessageHeadRoundTripsAndBoundsTheBody) {
  MessageHead head;
  head.type = MessageType::kCall;
  head.code = 5;
  head.id = -7;
  head.body_size = 1000;
  head.body_address = 0xabc;
  head.body_key = 0xdef;
  std::string bytes(kMessageHeadSize, '\0');
  write_message_head(head, bytes.data());
  absl::StatusOr<MessageHead> read = read_message_head(bytes);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->type, MessageType::kCall);
  EXPECT_EQ(read->id, -7);
  EXPECT_EQ(read->body_key, 0xdefu);
  head.body_size = kMaxSegmentBytes + 1;
  write_message_head(head, bytes.data());
  EXPECT_THAT(read_message_head(bytes),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(read_message_head(bytes.substr(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Frame, BodyRoundTripsInlineAndRemoteSegments) {
  std::vector<SegmentDesc> segments(3);
  segments[0].size = 5;
  segments[1].size = 1 << 20;
  segments[1].remote = true;
  segments[1].address = 77;
  segments[1].key = 88;
  segments[2].size = 0;
  const std::string body = body_bytes(segments, {"hello", "", ""});
  absl::StatusOr<Body> read = read_body(body);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->segments.size(), 3u);
  EXPECT_EQ(std::string(read->inline_data[0], 5), "hello");
  EXPECT_TRUE(read->segments[1].remote);
  EXPECT_EQ(read->segments[1].address, 77u);
  EXPECT_EQ(read->segments[1].key, 88u);
  EXPECT_EQ(read->inline_data[1], nullptr);
  EXPECT_EQ(read->segments[2].size, 0u);
}

TEST(Frame, MalformedBodiesAreInvalidArgument) {
  std::vector<SegmentDesc> one(1);
  one[0].size = 4;
  const std::string good = body_bytes(one, {"abcd"});
  std::vector<SegmentDesc> empty_remote(1);
  empty_remote[0].remote = true;
  std::string zero_count(4, '\0');
  std::string huge_count = good;
  huge_count[3] = 0x7f;
  std::string bad_mode = good;
  bad_mode[4] = 2;
  for (const std::string& bytes :
       {std::string("ab"), zero_count, huge_count, bad_mode, good + "x",
        good.substr(0, good.size() - 1), body_bytes(empty_remote, {""})}) {
    EXPECT_THAT(read_body(bytes),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST(Frame, ChunksCutTheBodyThenTheRemoteSegmentsInOrder) {
  std::vector<SegmentDesc> segments(3);
  segments[0].size = 10;  // inline: no chunks
  segments[1].size = 25;
  segments[1].remote = true;
  segments[2].size = 10;
  segments[2].remote = true;
  std::vector<Chunk> chunks;
  ASSERT_THAT(plan_body_chunks(12, 10, chunks), IsOk());
  ASSERT_THAT(plan_chunks(segments, 10, chunks), IsOk());
  ASSERT_EQ(chunks.size(), 6u);
  EXPECT_EQ(chunks[0].segment, kBodySegment);
  EXPECT_EQ(chunks[1].length, 2u);
  EXPECT_EQ(chunks[2].segment, 1u);
  EXPECT_EQ(chunks[4].offset, 20u);
  EXPECT_EQ(chunks[4].length, 5u);
  EXPECT_EQ(chunks[5].segment, 2u);
}

TEST(Frame, ChunkPlansAreBounded) {
  std::vector<SegmentDesc> segments(1);
  segments[0].size = kMaxSegmentBytes;
  segments[0].remote = true;
  std::vector<Chunk> chunks;
  EXPECT_THAT(plan_chunks(segments, 1, chunks),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(plan_body_chunks(10, 0, chunks),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Frame, AuthFramesRoundTrip) {
  AuthFrame frame;
  frame.step = AuthStep::kServerProof;
  frame.name = "w1";
  frame.challenge = std::string(32, '\x7f');
  frame.proof = std::string("\0proof", 6);
  absl::StatusOr<AuthFrame> read = read_auth(write_auth(frame));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->step, AuthStep::kServerProof);
  EXPECT_EQ(read->name, "w1");
  EXPECT_EQ(read->challenge, frame.challenge);
  EXPECT_EQ(read->proof, frame.proof);
  // A long refusal reason is cut, not refused.
  frame.step = AuthStep::kRefused;
  frame.proof = std::string(5000, 'r');
  read = read_auth(write_auth(frame));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->proof.size(), kMaxAuthField);
}

TEST(Frame, MalformedAuthFramesAreInvalidArgument) {
  AuthFrame frame;
  frame.name = "w0";
  frame.challenge = "0123456789";
  const std::string good = write_auth(frame);
  std::string bad_step = good;
  bad_step[0] = 9;
  std::string too_long_field = good;
  too_long_field[1] = static_cast<char>(0xff);
  too_long_field[2] = static_cast<char>(0xff);
  for (const std::string& bad :
       {std::string(), good.substr(0, 6), good.substr(0, good.size() - 1),
        good + "x", bad_step, too_long_field}) {
    EXPECT_THAT(read_auth(bad), StatusIs(absl::StatusCode::kInvalidArgument))
        << bad.size();
  }
  // An auth frame's header is a valid header.
  FrameHeader header;
  header.kind = FrameKind::kAuth;
  EXPECT_THAT(read_header(header_bytes(header)), IsOk());
}

TEST(Frame, BodiesOverTheLimitsAreResourceExhausted) {
  MessageLimits limits;
  limits.max_payload_bytes = 100;
  limits.max_storages = 2;
  limits.max_storage_bytes = 1000;
  auto body_of = [](std::vector<uint64_t> sizes) {
    Body body;
    for (uint64_t size : sizes) {
      SegmentDesc segment;
      segment.size = size;
      segment.remote = true;
      body.segments.push_back(segment);
    }
    return body;
  };
  EXPECT_THAT(check_limits(body_of({100, 500, 500}), limits), IsOk());
  EXPECT_THAT(check_limits(body_of({101}), limits),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_payload_bytes")));
  EXPECT_THAT(check_limits(body_of({0, 1, 1, 1}), limits),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_storages")));
  EXPECT_THAT(check_limits(body_of({0, 500, 501}), limits),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_storage_bytes")));
  EXPECT_THAT(check_limits(body_of({0, kMaxSegmentBytes, kMaxSegmentBytes}),
                           limits),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // A body within the limits is never larger than max_body_size.
  std::vector<SegmentDesc> segments(3);
  segments[0].size = 100;
  segments[1].size = 500;
  segments[2].size = 500;
  EXPECT_LE(body_size(segments), max_body_size(limits));
}

TEST(Frame, ASegmentCountTheBodyCannotHoldIsRefusedBeforeReserving) {
  std::string body(4, '\0');
  const uint32_t count = kMaxSegments;
  std::memcpy(body.data(), &count, 4);
  body += std::string(20, '\0');
  EXPECT_THAT(read_body(body), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("segments in")));
}

TEST(Frame, BulkTagsCarryTheRankAndSequence) {
  EXPECT_NE(bulk_tag(1, 5), bulk_tag(2, 5));
  EXPECT_NE(bulk_tag(1, 5), bulk_tag(1, 6));
  // Never an eager tag.
  EXPECT_NE(bulk_tag(3, 9) & ~kEagerIgnore, kEagerTag);
}

}  // namespace
}  // namespace tether::backends::libfabric::internal
