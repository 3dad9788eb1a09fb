#include "backends/grpc/internal/framing.h"

#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::backends::grpc::internal {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr size_t kChunk = 4096;

c10::Storage storage_of(size_t nbytes, uint8_t seed) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::GetCPUAllocator(), /*resizable=*/false);
  auto* data = static_cast<uint8_t*>(storage.data());
  for (size_t i = 0; i < nbytes; ++i) data[i] = static_cast<uint8_t>(seed + i);
  return storage;
}

bool matches(const c10::Storage& storage, size_t nbytes, uint8_t seed) {
  if (storage.nbytes() != nbytes) return false;
  const auto* data = static_cast<const uint8_t*>(storage.data());
  for (size_t i = 0; i < nbytes; ++i) {
    if (data[i] != static_cast<uint8_t>(seed + i)) return false;
  }
  return true;
}

// The bytes of a run of slices.
std::string flatten(const std::vector<::grpc::Slice>& slices) {
  std::string out;
  for (const ::grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// `bytes` as slices of at most `piece` bytes, as gRPC may hand them over.
std::vector<::grpc::Slice> sliced(const std::string& bytes, size_t piece) {
  std::vector<::grpc::Slice> out;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    out.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  return out;
}

// Every frame of `message`, each as its bytes.
std::vector<std::string> frames_of(
    std::shared_ptr<const OutgoingMessage> message) {
  OutgoingCursor cursor(std::move(message));
  std::vector<std::string> frames;
  while (!cursor.done()) {
    std::vector<::grpc::Slice> slices;
    const size_t bytes = cursor.append_next_frame(kChunk, slices);
    frames.push_back(flatten(slices));
    EXPECT_EQ(frames.back().size(), bytes);
  }
  return frames;
}

Message request_with(std::vector<size_t> sizes, std::string payload = "hi") {
  Message message;
  message.type = MessageType::kPing;
  message.id = 7;
  message.payload = std::move(payload);
  for (size_t i = 0; i < sizes.size(); ++i) {
    message.storages.push_back(storage_of(sizes[i], static_cast<uint8_t>(i)));
  }
  return message;
}

// `message`, which must make one frame, through an assembler in slices
// of `piece` bytes: what it completed.
std::vector<Received> through_one_frame(
    std::shared_ptr<const OutgoingMessage> message, size_t piece) {
  std::vector<std::string> frames = frames_of(std::move(message));
  EXPECT_EQ(frames.size(), 1u);
  Assembler assembler(1 << 30);
  std::vector<Received> done;
  for (const std::string& frame : frames) {
    EXPECT_THAT(assembler.consume(sliced(frame, piece), done), IsOk());
  }
  return done;
}

TEST(GrpcFraming, SmallMessageIsOneHeadFrame) {
  std::vector<Received> done =
      through_one_frame(make_request(request_with({0, 10})), 5);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].is_response);
  EXPECT_EQ(done[0].id, 7);
  ASSERT_THAT(done[0].result, IsOk());
  EXPECT_EQ(done[0].result->type, MessageType::kPing);
  EXPECT_EQ(done[0].result->payload, "hi");
  ASSERT_EQ(done[0].result->storages.size(), 2u);
  EXPECT_TRUE(matches(done[0].result->storages[0], 0, 0));
  EXPECT_TRUE(matches(done[0].result->storages[1], 10, 1));
}

TEST(GrpcFraming, LargeBuffersTravelInChunksThatReferenceTheStorage) {
  constexpr size_t kPayload = kInlineLimit + 10;          // 5 chunks
  constexpr size_t kBig = kInlineLimit + 3 * kChunk + 5;  // 8 chunks
  constexpr size_t kLast = kInlineLimit + 1;              // 5 chunks
  Message request =
      request_with({kBig, 100, kLast}, std::string(kPayload, 'p'));
  const void* big = request.storages[0].data();
  std::shared_ptr<const OutgoingMessage> message =
      make_request(std::move(request));
  // The payload and storages 0 and 2 are chunked; storage 1 rides inline.
  EXPECT_EQ(message->inline_buffer,
            (std::vector<bool>{false, false, true, false}));

  OutgoingCursor cursor(message);
  std::vector<::grpc::Slice> head;
  cursor.append_next_frame(kChunk, head);
  EXPECT_EQ(head.size(), 1u);
  for (int i = 0; i < 5; ++i) {
    std::vector<::grpc::Slice> chunk;
    cursor.append_next_frame(kChunk, chunk);
    ASSERT_EQ(chunk.size(), 2u);  // a header, then the payload's bytes
  }
  std::vector<::grpc::Slice> first_of_big;
  cursor.append_next_frame(kChunk, first_of_big);
  ASSERT_EQ(first_of_big.size(), 2u);
  // Not a copy: the slice points into the storage.
  EXPECT_EQ(static_cast<const void*>(first_of_big[1].begin()), big);

  std::vector<std::string> frames = frames_of(message);
  EXPECT_EQ(frames.size(), 1u + 5 + 8 + 5);
  // One frame per gRPC message, then all in one, in slices of 7 bytes.
  for (bool together : {false, true}) {
    Assembler assembler(1 << 30);
    std::vector<Received> done;
    if (together) {
      std::string all;
      for (const std::string& frame : frames) all += frame;
      ASSERT_THAT(assembler.consume(sliced(all, 7), done), IsOk());
    } else {
      for (const std::string& frame : frames) {
        EXPECT_TRUE(done.empty());
        ASSERT_THAT(assembler.consume(sliced(frame, 1000), done), IsOk());
      }
    }
    ASSERT_EQ(done.size(), 1u);
    ASSERT_THAT(done[0].result, IsOk());
    EXPECT_EQ(done[0].result->payload, std::string(kPayload, 'p'));
    ASSERT_EQ(done[0].result->storages.size(), 3u);
    EXPECT_TRUE(matches(done[0].result->storages[0], kBig, 0));
    EXPECT_TRUE(matches(done[0].result->storages[1], 100, 1));
    EXPECT_TRUE(matches(done[0].result->storages[2], kLast, 2));
    EXPECT_EQ(assembler.partial(), 0u);
  }
}

TEST(GrpcFraming, InterleavedMessagesAssembleIndependently) {
  // 11, 6 and 7 frames.
  Message big = request_with({10 * kChunk});
  big.id = 1;
  Message small = request_with({kInlineLimit + 1});
  small.id = 2;
  std::vector<std::string> a = frames_of(make_request(std::move(big)));
  std::vector<std::string> b = frames_of(make_request(std::move(small)));
  Message response = request_with({kInlineLimit + 2 * kChunk});
  response.type = MessageType::kPong;
  response.id = 1;  // same id as a request, other direction
  std::vector<std::string> c = frames_of(make_response(1, response));
  Assembler assembler(1 << 30);
  std::vector<Received> done;
  size_t i = 0;
  for (; i < std::max({a.size(), b.size(), c.size()}); ++i) {
    for (const auto* frames : {&a, &b, &c}) {
      if (i < frames->size()) {
        ASSERT_THAT(assembler.consume(sliced((*frames)[i], 4096), done),
                    IsOk());
      }
    }
  }
  ASSERT_EQ(done.size(), 3u);
  // The small request is complete first, then the response, then the big one.
  EXPECT_EQ(done[0].id, 2);
  EXPECT_FALSE(done[0].is_response);
  EXPECT_EQ(done[1].id, 1);
  EXPECT_TRUE(done[1].is_response);
  EXPECT_EQ(done[2].id, 1);
  EXPECT_FALSE(done[2].is_response);
  for (const Received& received : done) ASSERT_THAT(received.result, IsOk());
  EXPECT_TRUE(
      matches(done[1].result->storages[0], kInlineLimit + 2 * kChunk, 0));
  EXPECT_TRUE(matches(done[2].result->storages[0], 10 * kChunk, 0));
}

TEST(GrpcFraming, ErrorResponseCarriesCodeAndText) {
  std::vector<Received> done = through_one_frame(
      make_response(9, absl::NotFoundError("no such thing")), 64);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].is_response);
  EXPECT_EQ(done[0].id, 9);
  EXPECT_THAT(done[0].result, StatusIs(absl::StatusCode::kNotFound,
                                       HasSubstr("no such thing")));
}

TEST(GrpcFraming, MessageOverTheLimitIsRefusedAndSkipped) {
  std::vector<std::string> frames =
      frames_of(make_request(request_with({kInlineLimit + 5 * kChunk})));
  std::vector<std::string> next = frames_of(make_request(request_with({3})));
  Assembler assembler(/*max_message_bytes=*/kInlineLimit + 4 * kChunk);
  std::vector<Received> done;
  for (const std::string& frame : frames) {
    ASSERT_THAT(assembler.consume(sliced(frame, 4096), done), IsOk());
  }
  ASSERT_THAT(assembler.consume(sliced(next[0], 4096), done), IsOk());
  ASSERT_EQ(done.size(), 2u);
  EXPECT_THAT(done[0].result, StatusIs(absl::StatusCode::kResourceExhausted,
                                       HasSubstr("grpc.max_message_bytes")));
  ASSERT_THAT(done[1].result, IsOk());
  EXPECT_TRUE(matches(done[1].result->storages[0], 3, 0));
}

absl::Status consume_bytes(Assembler& assembler, const std::string& bytes) {
  std::vector<Received> done;
  return assembler.consume(sliced(bytes, 3), done);
}

// A refused message is answered at its head; the sender need
// not push the bytes that are only skipped before it learns.
TEST(GrpcFraming, MessageOverTheLimitIsAnsweredAtItsHead) {
  std::vector<std::string> frames =
      frames_of(make_request(request_with({kInlineLimit + 5 * kChunk})));
  ASSERT_GE(frames.size(), 2u);
  Assembler assembler(/*max_message_bytes=*/kInlineLimit);
  std::vector<Received> done;
  ASSERT_THAT(assembler.consume(sliced(frames[0], 4096), done), IsOk());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 7);
  EXPECT_THAT(done[0].result, StatusIs(absl::StatusCode::kResourceExhausted,
                                       HasSubstr("grpc.max_message_bytes")));
  // Its chunks are skipped, and answer nothing more.
  for (size_t i = 1; i < frames.size(); ++i) {
    ASSERT_THAT(assembler.consume(sliced(frames[i], 4096), done), IsOk());
  }
  EXPECT_EQ(done.size(), 1u);
  EXPECT_EQ(assembler.partial(), 0u);
}

// Sizes no agent may send (grpc.max_message_bytes is at most
// 2^40) are a stranger's: the stream ends, instead of waiting for ever for
// bytes to skip.
TEST(GrpcFraming, HeadsAnnouncingMoreThanAnySenderMayAreMalformed) {
  const std::string head = frames_of(make_request(
      request_with({kInlineLimit + kChunk, kInlineLimit + kChunk})))[0];
  // Buffer 0 is the payload, inline; buffers 1 and 2 are announced only.
  auto with_sizes = [&head](uint64_t first, uint64_t second) {
    std::string bytes = head;
    for (int i = 0; i < 8; ++i) {
      bytes[kPrefixBytes + kHeadFixedBytes + 8 + i] =
          static_cast<char>(first >> (8 * i));
      bytes[kPrefixBytes + kHeadFixedBytes + 16 + i] =
          static_cast<char>(second >> (8 * i));
    }
    return bytes;
  };
  constexpr uint64_t kTiB = uint64_t{1} << 40;
  for (const auto& [first, second] :
       std::vector<std::pair<uint64_t, uint64_t>>{
           {uint64_t{1} << 62, 1 << 20},
           {uint64_t{1} << 63, 1 << 20},
           {~uint64_t{0}, 1 << 20},
           {kTiB, kTiB},
           {kTiB / 2 + 1, kTiB / 2},
       }) {
    Assembler assembler(/*max_message_bytes=*/1 << 30);
    EXPECT_THAT(consume_bytes(assembler, with_sizes(first, second)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("more than any sender may send")))
        << first << " + " << second;
  }
  // At the bound: refused for this receiver, not malformed.
  Assembler assembler(/*max_message_bytes=*/1 << 30);
  std::vector<Received> done;
  ASSERT_THAT(
      assembler.consume(sliced(with_sizes(kTiB / 2, kTiB / 2 - 6), 4096), done),
      IsOk());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_THAT(done[0].result,
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(GrpcFraming, CheckLimitsNamesTheSetting) {
  std::shared_ptr<const OutgoingMessage> message =
      make_request(request_with({1000}));
  EXPECT_THAT(check_limits(*message, 2000, "x"), IsOk());
  EXPECT_THAT(check_limits(*message, 1000, "the request"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("grpc.max_message_bytes")));
}

TEST(GrpcFraming, MalformedFramesAreInvalidArgument) {
  std::vector<std::string> frames =
      frames_of(make_request(request_with({kInlineLimit + 3 * kChunk})));
  ASSERT_GE(frames.size(), 3u);
  std::vector<std::pair<std::string, std::string>> cases;
  cases.push_back({"empty", ""});
  std::string bad_magic = frames[0];
  bad_magic[0] = 'X';
  cases.push_back({"bad magic", bad_magic});
  cases.push_back({"truncated", frames[0].substr(0, frames[0].size() - 1)});
  cases.push_back({"chunk without head", frames[1]});
  cases.push_back({"chunk out of order", frames[0] + frames[2]});
  cases.push_back({"two heads", frames[0] + frames[0]});
  std::string bad_kind = frames[0];
  bad_kind[4] = 9;
  cases.push_back({"unknown kind", bad_kind});
  std::string bad_code = frames[0];
  bad_code[kPrefixBytes + 4] = 3;  // a status code in a request head
  cases.push_back({"code in a request", bad_code});
  std::string huge_body = frames[0];
  huge_body[8 + 7] = 0x7f;
  cases.push_back({"body larger than the message", huge_body});
  for (const auto& [what, bytes] : cases) {
    Assembler assembler(1 << 30);
    EXPECT_THAT(consume_bytes(assembler, bytes),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << what;
  }
}

TEST(GrpcFraming, AuthFramesReachTheHandlerInOrderAndOpenTheGate) {
  const std::string hello =
      flatten({make_auth_frame({AuthStep::kHello, "w1", "challenge"})});
  const std::string proof =
      flatten({make_auth_frame({AuthStep::kProof, "w1", std::string(32, 'p')})});
  const std::vector<std::string> request =
      frames_of(make_request(request_with({8})));
  ASSERT_EQ(request.size(), 1u);
  Assembler assembler(1 << 30);
  assembler.close_gate("no messages before authentication");
  std::vector<AuthFrame> seen;
  Assembler::AuthHandler handler = [&](const AuthFrame& frame) {
    seen.push_back(frame);
    if (frame.step == AuthStep::kProof) assembler.open_gate();
    return absl::OkStatus();
  };
  std::vector<Received> done;
  // One gRPC message: hello, proof, then a request the proof let through.
  ASSERT_THAT(assembler.consume(sliced(hello + proof + request[0], 5), done,
                                handler),
              IsOk());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].step, AuthStep::kHello);
  EXPECT_EQ(seen[0].name, "w1");
  EXPECT_EQ(seen[0].data, "challenge");
  EXPECT_EQ(seen[1].step, AuthStep::kProof);
  EXPECT_EQ(seen[1].data, std::string(32, 'p'));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_THAT(done[0].result, IsOk());
}

TEST(GrpcFraming, ClosedGateRefusesMessagesBeforeTheirHead) {
  const std::vector<std::string> request =
      frames_of(make_request(request_with({kInlineLimit + kChunk})));
  Assembler assembler(1 << 30);
  assembler.close_gate("worker 'w0' requires authentication");
  EXPECT_THAT(consume_bytes(assembler, request[0]),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("requires authentication")));
  EXPECT_EQ(assembler.partial(), 0u);
}

TEST(GrpcFraming, HandlerErrorStopsTheMessage) {
  const std::string hello =
      flatten({make_auth_frame({AuthStep::kHello, "w1", "c"})});
  Assembler assembler(1 << 30);
  std::vector<Received> done;
  EXPECT_THAT(
      assembler.consume(sliced(hello, 64), done,
                        [](const AuthFrame&) {
                          return absl::UnauthenticatedError("no secret here");
                        }),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("no secret")));
  // Without a handler, an authentication frame breaks the protocol.
  EXPECT_THAT(consume_bytes(assembler, hello),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GrpcFraming, MalformedAuthFramesAreInvalidArgument) {
  const std::string hello =
      flatten({make_auth_frame({AuthStep::kHello, "w1", "challenge"})});
  std::vector<std::pair<std::string, std::string>> cases;
  std::string bad_step = hello;
  bad_step[kPrefixBytes] = 9;
  cases.push_back({"unknown step", bad_step});
  std::string long_name = hello;
  long_name[kPrefixBytes + 4] = 100;  // more name than the body holds
  cases.push_back({"name past the body", long_name});
  std::string reserved = hello;
  reserved[kPrefixBytes + 1] = 1;
  cases.push_back({"reserved bytes", reserved});
  cases.push_back({"truncated", hello.substr(0, kPrefixBytes + 4)});
  const std::string huge = flatten({make_auth_frame(
      {AuthStep::kHello, "w1", std::string(kMaxAuthFieldBytes + 1, 'x')})});
  cases.push_back({"too much data", huge});
  for (const auto& [what, bytes] : cases) {
    Assembler assembler(1 << 30);
    std::vector<Received> done;
    EXPECT_THAT(assembler.consume(sliced(bytes, 7), done,
                                  [](const AuthFrame&) {
                                    return absl::OkStatus();
                                  }),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << what;
  }
}

}  // namespace
}  // namespace tether::backends::grpc::internal
