// Fuzz target for the TensorPipe backend's framing: what a peer's
// descriptor can make allocate_frame() and the frame readers do.
//
// An input is: one byte (bit 0: the descriptor has a payload entry; bits
// 1-2: how many tensor entries, 0-3; bits 3-5: how many more payload
// entries, 0-7, as frames of flag kPayloads carry), then a little-endian
// u16 length per entry (payloads first), then the metadata (the frame
// header, and inline data). The
// framing_corpus/ seeds are real frames (make_framing_corpus.cc writes
// them).
//
// Properties checked: allocate_frame never crashes and fails only with
// INVALID_ARGUMENT or RESOURCE_EXHAUSTED (never allocating over the limits
// below: a message over them is a refused frame, whose result is
// RESOURCE_EXHAUSTED); a frame it accepts reads back without crashing, an
// auth frame parses or fails with INVALID_ARGUMENT. A descriptor of
// metadata alone is also read as an express frame (allocate_express_frame),
// which must accept exactly the inline frames the descriptor's reader
// accepts.
#include <tensorpipe/common/cpu_buffer.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/tensorpipe/internal/framing.h"
#include "core/toolkit/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tether::backends::tensorpipe::internal::FrameKind;
  if (size == 0) return 0;
  const int payloads = (data[0] & 1) + ((data[0] >> 3) & 7);
  const int tensors = (data[0] >> 1) & 3;
  size_t at = 1;
  auto length = [&]() -> size_t {
    if (at + 2 > size) return 0;
    const size_t n = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    return n;
  };
  ::tensorpipe::Descriptor descriptor;
  for (int i = 0; i < payloads; ++i) {
    ::tensorpipe::Descriptor::Payload payload;
    payload.length = length();
    descriptor.payloads.push_back(payload);
  }
  for (int i = 0; i < tensors; ++i) {
    ::tensorpipe::Descriptor::Tensor tensor;
    tensor.length = length();
    tensor.sourceDevice = ::tensorpipe::Device{::tensorpipe::kCpuDeviceType, 0};
    descriptor.tensors.push_back(tensor);
  }
  if (at > size) return 0;
  descriptor.metadata.assign(reinterpret_cast<const char*>(data + at),
                             size - at);

  tether::MessageLimits limits;
  limits.max_payload_bytes = 1 << 20;
  limits.max_storages = 64;
  limits.max_storage_bytes = 1 << 20;
  auto frame = tether::backends::tensorpipe::internal::allocate_frame(
      descriptor, limits);
  if (descriptor.payloads.empty() && descriptor.tensors.empty()) {
    // The same bytes as an express frame: accepted exactly when they are
    // an inline frame the descriptor's reader accepts.
    auto express =
        tether::backends::tensorpipe::internal::allocate_express_frame(
            descriptor.metadata, limits);
    TETHER_CHECK(express.ok() == (frame.ok() && (*frame)->header.inline_data),
                 "an express frame read differently from its descriptor");
    TETHER_CHECK(express.ok() ||
                     express.status().code() ==
                         absl::StatusCode::kInvalidArgument ||
                     express.status().code() ==
                         absl::StatusCode::kResourceExhausted,
                 "a refused express frame is not INVALID_ARGUMENT or "
                 "RESOURCE_EXHAUSTED");
  }
  if (!frame.ok()) {
    TETHER_CHECK(
        frame.status().code() == absl::StatusCode::kInvalidArgument ||
            frame.status().code() == absl::StatusCode::kResourceExhausted,
        "a refused descriptor is not INVALID_ARGUMENT or RESOURCE_EXHAUSTED");
    return 0;
  }
  if ((*frame)->header.kind == FrameKind::kAuth) {
    auto auth = (*frame)->take_auth();
    TETHER_CHECK(
        auth.ok() || auth.status().code() == absl::StatusCode::kInvalidArgument,
        "a malformed auth frame is not INVALID_ARGUMENT");
    return 0;
  }
  const bool refused = !(*frame)->refused.ok();
  absl::StatusOr<tether::Message> result = (*frame)->take_result();
  TETHER_CHECK(!refused || result.status().code() ==
                               absl::StatusCode::kResourceExhausted,
               "a refused frame's result is not RESOURCE_EXHAUSTED");
  return 0;
}
