#include "backends/tensorpipe/internal/framing.h"

#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <tensorpipe/common/cpu_buffer.h>

#include <cstring>

#include "testing/status_matchers.h"

namespace tether::backends::tensorpipe::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

c10::Storage storage_of(size_t nbytes, uint8_t fill) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::GetCPUAllocator(), /*resizable=*/false);
  if (nbytes > 0) std::memset(storage.data(), fill, nbytes);
  return storage;
}

// What the receiving pipe would report for `message`.
::tensorpipe::Descriptor descriptor_of(const ::tensorpipe::Message& message) {
  ::tensorpipe::Descriptor descriptor;
  descriptor.metadata = message.metadata;
  for (const auto& payload : message.payloads) {
    descriptor.payloads.push_back({payload.length, payload.metadata});
  }
  for (const auto& tensor : message.tensors) {
    ::tensorpipe::Descriptor::Tensor entry;
    entry.length = tensor.length;
    entry.sourceDevice = tensor.buffer.device();
    entry.targetDevice = tensor.targetDevice;
    descriptor.tensors.push_back(entry);
  }
  return descriptor;
}

// Copies what a pipe would carry from `message` into `frame`'s allocation.
void deliver(const ::tensorpipe::Message& message, IncomingFrame& frame) {
  ASSERT_EQ(message.payloads.size(), frame.allocation.payloads.size());
  for (size_t i = 0; i < message.payloads.size(); ++i) {
    std::memcpy(frame.allocation.payloads[i].data, message.payloads[i].data,
                message.payloads[i].length);
  }
  ASSERT_EQ(message.tensors.size(), frame.allocation.tensors.size());
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    std::memcpy(frame.allocation.tensors[i]
                    .buffer.unwrap<::tensorpipe::CpuBuffer>()
                    .ptr,
                message.tensors[i].buffer.unwrap<::tensorpipe::CpuBuffer>().ptr,
                message.tensors[i].length);
  }
}

TEST(Framing, HeaderRoundTrips) {
  FrameHeader header;
  header.kind = FrameKind::kResponse;
  header.type = MessageType::kCallRet;
  header.id = -42;
  header.payload_size = 7;
  header.storage_sizes = {0, 1, uint64_t{1} << 40};
  absl::StatusOr<FrameHeader> decoded = decode_header(encode_header(header));
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->kind, FrameKind::kResponse);
  EXPECT_EQ(decoded->type, MessageType::kCallRet);
  EXPECT_EQ(decoded->id, -42);
  EXPECT_EQ(decoded->code, 0);
  EXPECT_EQ(decoded->payload_size, 7u);
  EXPECT_THAT(decoded->storage_sizes, ElementsAre(0, 1, uint64_t{1} << 40));
}

TEST(Framing, RejectsMalformedHeaders) {
  FrameHeader header;
  header.storage_sizes = {3};
  const std::string good = encode_header(header);
  ASSERT_THAT(decode_header(good), IsOk());

  EXPECT_THAT(decode_header(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(decode_header(good.substr(0, good.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(decode_header(good + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_THAT(decode_header(bad_magic),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  std::string bad_kind = good;
  bad_kind[4] = 9;
  EXPECT_THAT(decode_header(bad_kind),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kind")));
  std::string huge_count = good;
  huge_count[35] = 0x7f;
  EXPECT_THAT(decode_header(huge_count),
              StatusIs(absl::StatusCode::kInvalidArgument));

  FrameHeader error;
  error.kind = FrameKind::kError;  // but code 0
  EXPECT_THAT(decode_header(encode_header(error)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  FrameHeader coded;
  coded.code = 5;  // a request with a status code
  EXPECT_THAT(decode_header(encode_header(coded)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Framing, LargeRequestTravelsWithPayloadAndStoragesOutOfBand) {
  Message request;
  request.type = MessageType::kPing;
  request.id = 9;
  request.payload = "hello";
  // Over the payload limit, so the storages travel through a channel.
  const size_t big = kPayloadLimit + 10;
  request.storages = {storage_of(big, 1), storage_of(0, 0), storage_of(3, 2)};
  std::shared_ptr<OutgoingFrame> out = make_request_frame(request);
  ::tensorpipe::Message message = out->to_tensorpipe();
  ASSERT_EQ(message.payloads.size(), 1u);
  // The empty storage stays off the wire.
  ASSERT_EQ(message.tensors.size(), 2u);
  EXPECT_EQ(message.tensors[0].length, big);
  EXPECT_EQ(message.tensors[1].length, 3u);
  // Every tensor names its target device (the receiver's pipe then sends
  // no descriptor reply before the channel starts).
  for (const ::tensorpipe::Message::Tensor& tensor : message.tensors) {
    ASSERT_TRUE(tensor.targetDevice.has_value());
    EXPECT_EQ(tensor.targetDevice->type, ::tensorpipe::kCpuDeviceType);
  }
  // Zero-copy: the tensorpipe message points at the caller's bytes.
  EXPECT_EQ(message.tensors[0].buffer.unwrap<::tensorpipe::CpuBuffer>().ptr,
            request.storages[0].data());

  absl::StatusOr<std::shared_ptr<IncomingFrame>> in =
      allocate_frame(descriptor_of(message));
  ASSERT_THAT(in, IsOk());
  deliver(message, **in);
  absl::StatusOr<Message> received = (*in)->take_result();
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->type, MessageType::kPing);
  EXPECT_EQ(received->id, 9);
  EXPECT_EQ(received->payload, "hello");
  ASSERT_EQ(received->storages.size(), 3u);
  EXPECT_EQ(received->storages[0].nbytes(), big);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[0].data())[9], 1);
  EXPECT_EQ(received->storages[1].nbytes(), 0u);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[2].data())[2], 2);
  EXPECT_NE(received->storages[0].data(), request.storages[0].data());
}

// Over the inline limit and within the payload limit, storages follow the
// payload as the pipe's own payloads, read straight into the receiver's
// storages; no channel, no tensor.
TEST(Framing, MidSizeRequestTravelsAsPipePayloads) {
  Message request;
  request.type = MessageType::kCall;
  request.id = 11;
  request.payload = "envelope";
  const size_t mid = kInlineLimit + 10;
  request.storages = {storage_of(mid, 5), storage_of(0, 0), storage_of(3, 6)};
  std::shared_ptr<OutgoingFrame> out = make_request_frame(request);
  EXPECT_FALSE(out->header.inline_data);
  EXPECT_TRUE(out->header.storages_as_payloads);
  ::tensorpipe::Message message = out->to_tensorpipe();
  EXPECT_TRUE(message.tensors.empty());
  ASSERT_EQ(message.payloads.size(), 3u);  // the envelope, then two storages
  EXPECT_EQ(message.payloads[1].length, mid);
  EXPECT_EQ(message.payloads[2].length, 3u);
  // Zero-copy: the payloads point at the caller's bytes.
  EXPECT_EQ(message.payloads[1].data, request.storages[0].data());

  absl::StatusOr<std::shared_ptr<IncomingFrame>> in =
      allocate_frame(descriptor_of(message));
  ASSERT_THAT(in, IsOk());
  ASSERT_EQ((*in)->allocation.payloads.size(), 3u);
  EXPECT_TRUE((*in)->allocation.tensors.empty());
  // Read straight into the storage the receiver gets.
  EXPECT_EQ((*in)->allocation.payloads[1].data, (*in)->storages[0].data());
  deliver(message, **in);
  absl::StatusOr<Message> received = (*in)->take_result();
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->type, MessageType::kCall);
  EXPECT_EQ(received->id, 11);
  EXPECT_EQ(received->payload, "envelope");
  ASSERT_EQ(received->storages.size(), 3u);
  EXPECT_EQ(received->storages[0].nbytes(), mid);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[0].data())[mid - 1], 5);
  EXPECT_EQ(received->storages[1].nbytes(), 0u);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[2].data())[2], 6);

  // Without an envelope the storages are payloads from 0; a response takes
  // the same path.
  Message bare;
  bare.type = MessageType::kCallRet;
  bare.storages = {storage_of(kPayloadLimit, 7)};
  std::shared_ptr<OutgoingFrame> answer_frame =
      make_response_frame(3, absl::StatusOr<Message>(bare));
  ::tensorpipe::Message answer = answer_frame->to_tensorpipe();
  ASSERT_EQ(answer.payloads.size(), 1u);
  EXPECT_EQ(answer.payloads[0].length, kPayloadLimit);
  EXPECT_TRUE(answer.tensors.empty());
  in = allocate_frame(descriptor_of(answer));
  ASSERT_THAT(in, IsOk());
  deliver(answer, **in);
  received = (*in)->take_result();
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->payload, "");
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[0].data())[0], 7);

  // One byte over the payload limit goes through a channel.
  bare.storages.push_back(storage_of(1, 8));
  ::tensorpipe::Message over =
      make_response_frame(4, absl::StatusOr<Message>(bare))->to_tensorpipe();
  EXPECT_TRUE(over.payloads.empty());
  EXPECT_EQ(over.tensors.size(), 2u);
}

// `request` through a frame that must carry it inline (no payloads, no
// tensors), and back.
absl::StatusOr<Message> through_inline_frame(const Message& request) {
  ::tensorpipe::Message message = make_request_frame(request)->to_tensorpipe();
  EXPECT_TRUE(message.payloads.empty());
  EXPECT_TRUE(message.tensors.empty());
  absl::StatusOr<std::shared_ptr<IncomingFrame>> in =
      allocate_frame(descriptor_of(message));
  if (!in.ok()) return in.status();
  return (*in)->take_result();
}

TEST(Framing, SmallMessageTravelsInlineInTheMetadata) {
  Message request;
  request.type = MessageType::kPing;
  request.id = 4;
  request.payload = "hello";
  request.storages = {storage_of(10, 1), storage_of(0, 0), storage_of(3, 2)};
  absl::StatusOr<Message> received = through_inline_frame(request);
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->id, 4);
  EXPECT_EQ(received->payload, "hello");
  ASSERT_EQ(received->storages.size(), 3u);
  EXPECT_EQ(received->storages[0].nbytes(), 10u);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[0].data())[9], 1);
  EXPECT_EQ(received->storages[1].nbytes(), 0u);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[2].data())[2], 2);
}

// A tensor of the inline limit with its envelope (payload and storages
// over the limit together, each within it) still travels inline; one byte more of
// storage does not.
TEST(Framing, PayloadAndStoragesAreBoundedApartForInline) {
  Message request;
  request.type = MessageType::kCallRet;
  request.payload = std::string(300, 'e');
  request.storages = {storage_of(kInlineLimit - 1, 7), storage_of(1, 8)};
  absl::StatusOr<Message> received = through_inline_frame(request);
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->payload, request.payload);
  ASSERT_EQ(received->storages.size(), 2u);
  EXPECT_EQ(received->storages[0].nbytes(), kInlineLimit - 1);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[0].data())[100], 7);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[1].data())[0], 8);

  request.storages.push_back(storage_of(1, 9));
  ::tensorpipe::Message over = make_request_frame(request)->to_tensorpipe();
  EXPECT_EQ(over.payloads.size(), 4u);  // the envelope and three storages
  EXPECT_TRUE(over.tensors.empty());
}

TEST(Framing, InlineFrameWithWrongLengthIsRejected) {
  Message request;
  request.type = MessageType::kPing;
  request.payload = "hello";
  request.storages = {storage_of(10, 1)};
  ::tensorpipe::Message message = make_request_frame(request)->to_tensorpipe();
  ::tensorpipe::Descriptor descriptor = descriptor_of(message);
  descriptor.metadata.pop_back();
  EXPECT_THAT(allocate_frame(descriptor),
              StatusIs(absl::StatusCode::kInvalidArgument));
  descriptor.metadata += "xy";
  EXPECT_THAT(allocate_frame(descriptor),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Framing, EmptyMessageHasNoBuffers) {
  Message request;
  request.type = MessageType::kPing;
  request.storages = {storage_of(0, 0)};
  absl::StatusOr<Message> received = through_inline_frame(request);
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->payload, "");
  ASSERT_EQ(received->storages.size(), 1u);
  EXPECT_EQ(received->storages[0].nbytes(), 0u);
}

TEST(Framing, ErrorResponseCarriesCodeAndText) {
  std::shared_ptr<OutgoingFrame> out = make_response_frame(
      7, absl::StatusOr<Message>(absl::NotFoundError("no such op")));
  ::tensorpipe::Message message = out->to_tensorpipe();
  absl::StatusOr<std::shared_ptr<IncomingFrame>> in =
      allocate_frame(descriptor_of(message));
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ((*in)->header.kind, FrameKind::kError);
  EXPECT_EQ((*in)->header.id, 7);
  deliver(message, **in);
  EXPECT_THAT((*in)->take_result(), StatusIs(absl::StatusCode::kNotFound,
                                             ::testing::Eq("no such op")));
}

TEST(Framing, RejectsDescriptorsThatDisagreeWithTheHeader) {
  Message request;
  request.payload = "abc";
  // Over the payload limit: payload and tensor travel out of band.
  request.storages = {storage_of(kPayloadLimit + 4, 0)};
  ::tensorpipe::Message message = make_request_frame(request)->to_tensorpipe();
  const ::tensorpipe::Descriptor good = descriptor_of(message);
  ASSERT_THAT(allocate_frame(good), IsOk());
  ::tensorpipe::Descriptor tensor_as_payload = good;
  tensor_as_payload.payloads.push_back({good.tensors[0].length, ""});
  tensor_as_payload.tensors.clear();
  EXPECT_THAT(allocate_frame(tensor_as_payload),
              StatusIs(absl::StatusCode::kInvalidArgument));

  ::tensorpipe::Descriptor no_payload = good;
  no_payload.payloads.clear();
  EXPECT_THAT(allocate_frame(no_payload),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ::tensorpipe::Descriptor extra_tensor = good;
  extra_tensor.tensors.push_back(good.tensors[0]);
  EXPECT_THAT(allocate_frame(extra_tensor),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ::tensorpipe::Descriptor wrong_length = good;
  wrong_length.tensors[0].length = 5;
  EXPECT_THAT(allocate_frame(wrong_length),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ::tensorpipe::Descriptor on_gpu = good;
  on_gpu.tensors[0].sourceDevice = ::tensorpipe::Device("cuda", 0);
  EXPECT_THAT(allocate_frame(on_gpu),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CPU")));
  ::tensorpipe::Descriptor garbage = good;
  garbage.metadata = "not a header";
  EXPECT_THAT(allocate_frame(garbage),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Framing, RejectsPayloadFramesThatDisagreeWithTheHeader) {
  Message request;
  request.payload = "abc";
  request.storages = {storage_of(kInlineLimit + 4, 0), storage_of(9, 1)};
  ::tensorpipe::Message message = make_request_frame(request)->to_tensorpipe();
  const ::tensorpipe::Descriptor good = descriptor_of(message);
  ASSERT_EQ(good.payloads.size(), 3u);
  ASSERT_THAT(allocate_frame(good), IsOk());

  ::tensorpipe::Descriptor missing = good;
  missing.payloads.pop_back();
  EXPECT_THAT(allocate_frame(missing),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("payloads do not match")));
  ::tensorpipe::Descriptor extra = good;
  extra.payloads.push_back(good.payloads[2]);
  EXPECT_THAT(allocate_frame(extra),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ::tensorpipe::Descriptor wrong_length = good;
  wrong_length.payloads[1].length = 5;
  EXPECT_THAT(allocate_frame(wrong_length),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ::tensorpipe::Descriptor wrong_envelope = good;
  wrong_envelope.payloads[0].length = 2;
  EXPECT_THAT(allocate_frame(wrong_envelope),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ::tensorpipe::Descriptor with_tensor = good;
  ::tensorpipe::Descriptor::Tensor tensor;
  tensor.length = 9;
  tensor.sourceDevice = ::tensorpipe::Device{::tensorpipe::kCpuDeviceType, 0};
  with_tensor.tensors.push_back(tensor);
  EXPECT_THAT(allocate_frame(with_tensor),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Inline and as payloads at once is no frame.
  ::tensorpipe::Descriptor both = good;
  both.metadata[5] = 3;
  EXPECT_THAT(allocate_frame(both), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("unknown flags")));
}

TEST(Framing, UnknownStatusCodeBecomesUnknown) {
  FrameHeader header;
  header.kind = FrameKind::kError;
  header.code = 99;
  ::tensorpipe::Descriptor descriptor;
  descriptor.metadata = encode_header(header);
  absl::StatusOr<std::shared_ptr<IncomingFrame>> in =
      allocate_frame(descriptor);
  ASSERT_THAT(in, IsOk());
  EXPECT_THAT((*in)->take_result(), StatusIs(absl::StatusCode::kUnknown));
}

}  // namespace
}  // namespace tether::backends::tensorpipe::internal

namespace tether::backends::tensorpipe::internal {
namespace {

// A message over the limits is refused before anything is allocated for it:
// its frame reads the bytes into a discard region (the pipe must move past
// them) and yields RESOURCE_EXHAUSTED naming the limit. A terabyte, more
// than anyone may send, is an error: that peer loses its connection.
TEST(Framing, FramesOverTheLimitsAreRefusedBeforeAllocating) {
  Message request;
  request.type = MessageType::kPing;
  request.payload = std::string(100, 'p');
  request.storages = {storage_of(kPayloadLimit + 10, 1), storage_of(50, 2)};
  ::tensorpipe::Descriptor descriptor =
      descriptor_of(make_request_frame(request)->to_tensorpipe());
  MessageLimits limits;
  ASSERT_THAT(allocate_frame(descriptor, limits), IsOk());
  auto expect_refused = [&descriptor](const MessageLimits& limits,
                                      const std::string& why) {
    absl::StatusOr<std::shared_ptr<IncomingFrame>> frame =
        allocate_frame(descriptor, limits);
    ASSERT_THAT(frame, IsOk());
    EXPECT_THAT((*frame)->refused,
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(why)));
    EXPECT_TRUE((*frame)->payload.empty());
    EXPECT_TRUE((*frame)->storages.empty());
    ASSERT_NE((*frame)->discard, nullptr);
    EXPECT_EQ((*frame)->discard->length(), 100 + kPayloadLimit + 10 + 50);
    EXPECT_EQ((*frame)->allocation.payloads.size(), 1u);
    EXPECT_EQ((*frame)->allocation.tensors.size(), 2u);
    EXPECT_THAT((*frame)->take_result(),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(why)));
  };
  limits.max_payload_bytes = 99;
  expect_refused(limits, "payload of 100 bytes is over the limit "
                         "max_payload_bytes of 99");
  limits = MessageLimits();
  limits.max_storages = 1;
  expect_refused(limits, "2 tensor storages are over the limit max_storages");
  limits = MessageLimits();
  limits.max_storage_bytes = kPayloadLimit;
  expect_refused(limits, "max_storage_bytes");
  // A terabyte announced in the header, with the default limits.
  descriptor.tensors[0].length = uint64_t{1} << 40;
  FrameHeader header = *decode_header(descriptor.metadata);
  header.storage_sizes[0] = uint64_t{1} << 40;
  descriptor.metadata = encode_header(header);
  EXPECT_THAT(allocate_frame(descriptor),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

// Storages that travel as the pipe's payloads are discarded the same way:
// each payload its own stretch of the region.
TEST(Framing, PayloadFramesOverTheLimitsAreDiscarded) {
  Message request;
  request.type = MessageType::kPing;
  request.payload = std::string(100, 'p');
  request.storages = {storage_of(kInlineLimit + 10, 1), storage_of(50, 2)};
  // The message points into the frame: kept alive while it is delivered.
  std::shared_ptr<OutgoingFrame> out = make_request_frame(request);
  ::tensorpipe::Message message = out->to_tensorpipe();
  ASSERT_EQ(message.payloads.size(), 3u);
  MessageLimits limits;
  limits.max_storage_bytes = kInlineLimit;
  absl::StatusOr<std::shared_ptr<IncomingFrame>> frame =
      allocate_frame(descriptor_of(message), limits);
  ASSERT_THAT(frame, IsOk());
  EXPECT_THAT((*frame)->refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("max_storage_bytes")));
  ASSERT_NE((*frame)->discard, nullptr);
  EXPECT_EQ((*frame)->discard->length(), 100 + kInlineLimit + 10 + 50);
  ASSERT_EQ((*frame)->allocation.payloads.size(), 3u);
  EXPECT_EQ(static_cast<char*>((*frame)->allocation.payloads[2].data) -
                static_cast<char*>((*frame)->allocation.payloads[0].data),
            static_cast<std::ptrdiff_t>(100 + kInlineLimit + 10));
  deliver(message, **frame);  // the bytes land in the region
  EXPECT_THAT((*frame)->take_result(),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

// An inline frame's metadata, sent as an express frame, reads back as the
// same message; a frame that is not inline does not.
TEST(Framing, ExpressFramesAreInlineFramesMetadata) {
  Message request;
  request.type = MessageType::kCall;
  request.id = 11;
  request.payload = "express";
  request.storages = {storage_of(8, 3), storage_of(0, 0)};
  const std::string bytes = make_request_frame(request)->to_tensorpipe().metadata;
  absl::StatusOr<std::shared_ptr<IncomingFrame>> frame =
      allocate_express_frame(bytes);
  ASSERT_THAT(frame, IsOk());
  absl::StatusOr<Message> received = (*frame)->take_result();
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->type, MessageType::kCall);
  EXPECT_EQ(received->id, 11);
  EXPECT_EQ(received->payload, "express");
  ASSERT_EQ(received->storages.size(), 2u);
  EXPECT_EQ(static_cast<uint8_t*>(received->storages[0].data())[7], 3);

  EXPECT_THAT(allocate_express_frame(bytes.substr(0, bytes.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(allocate_express_frame(""),
              StatusIs(absl::StatusCode::kInvalidArgument));
  request.storages = {storage_of(kInlineLimit + 1, 1)};
  const std::string large =
      make_request_frame(request)->to_tensorpipe().metadata;
  EXPECT_THAT(allocate_express_frame(large),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Out of line with nothing out of line: well formed, but not express.
  FrameHeader bare;
  bare.kind = FrameKind::kRequest;
  EXPECT_THAT(allocate_express_frame(encode_header(bare)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not inline")));
}

// Over this worker's limits, an express request is refused alone (the
// connection goes on), as an inline one on the pipe is.
TEST(Framing, ExpressFramesOverTheLimitsAreRefused) {
  Message request;
  request.type = MessageType::kCall;
  request.payload = std::string(100, 'p');
  MessageLimits limits;
  limits.max_payload_bytes = 10;
  absl::StatusOr<std::shared_ptr<IncomingFrame>> frame = allocate_express_frame(
      make_request_frame(request)->to_tensorpipe().metadata, limits);
  ASSERT_THAT(frame, IsOk());
  EXPECT_THAT((*frame)->refused,
              StatusIs(absl::StatusCode::kResourceExhausted));
}

// Bind frames carry their nonce, inline and bare; any other shape is
// malformed.
TEST(Framing, BindFramesCarryANonce) {
  for (FrameKind kind : {FrameKind::kBind, FrameKind::kBindAck}) {
    const std::string bytes =
        make_bind_frame(kind, 0x0102030405060708)->to_tensorpipe().metadata;
    absl::StatusOr<std::shared_ptr<IncomingFrame>> frame =
        allocate_express_frame(bytes);
    ASSERT_THAT(frame, IsOk());
    EXPECT_EQ((*frame)->header.kind, kind);
    EXPECT_EQ((*frame)->take_nonce(), 0x0102030405060708u);
  }
  FrameHeader header;
  header.kind = FrameKind::kBind;
  header.inline_data = true;
  header.payload_size = 4;
  EXPECT_THAT(decode_header(encode_header(header) + "four"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bind frame")));
  header.payload_size = 8;
  header.storage_sizes = {1};
  EXPECT_THAT(decode_header(encode_header(header) + "eight..." + "s"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bind frame")));
}

}  // namespace
}  // namespace tether::backends::tensorpipe::internal
