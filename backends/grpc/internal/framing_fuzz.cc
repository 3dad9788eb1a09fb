// Fuzz target for the gRPC backend's framing: what a peer's bytes can make
// an Assembler do.
//
// An input is: one byte (bits 0-3: the size of the slices the bytes are cut
// into, 1 << n; bit 4: the gate starts closed, as on an agent with a
// secret; bit 5: the bytes are two gRPC messages, cut at the next byte's
// share of them), then the bytes. The framing_corpus/ seeds are real frames
// (make_framing_corpus.cc writes them).
//
// Properties checked: consume() never crashes and fails only with
// INVALID_ARGUMENT, or UNAUTHENTICATED while the gate is closed; a message
// it completes is a message, an error with a valid code, or
// RESOURCE_EXHAUSTED (over the limit below, never allocated).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/grpc/internal/framing.h"
#include "core/toolkit/check.h"

namespace {

using tether::backends::grpc::internal::Assembler;
using tether::backends::grpc::internal::AuthFrame;
using tether::backends::grpc::internal::AuthStep;
using tether::backends::grpc::internal::Received;

constexpr uint64_t kMaxMessageBytes = 1 << 20;

std::vector<::grpc::Slice> cut(const uint8_t* data, size_t size, size_t piece) {
  std::vector<::grpc::Slice> slices;
  for (size_t at = 0; at < size; at += piece) {
    const size_t n = size - at < piece ? size - at : piece;
    slices.emplace_back(data + at, n);
  }
  return slices;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t piece = size_t{1} << (data[0] & 0x0f);
  const bool gated = (data[0] & 0x10) != 0;
  const bool two = (data[0] & 0x20) != 0;
  const uint8_t share = data[1];
  data += 2;
  size -= 2;
  const size_t first = two ? size * share / 256 : size;

  Assembler assembler(kMaxMessageBytes);
  if (gated) assembler.close_gate("no messages before authentication");
  bool open = !gated;
  Assembler::AuthHandler on_auth = [&](const AuthFrame& frame) {
    TETHER_CHECK(frame.name.size() <= 4096 && frame.data.size() <= 4096,
                 "an auth frame larger than its bound");
    if (frame.step == AuthStep::kProof) {
      assembler.open_gate();
      open = true;
    }
    return absl::OkStatus();
  };
  const std::pair<size_t, size_t> messages[] = {{0, first},
                                                {first, size - first}};
  for (const auto& [at, bytes] : messages) {
    if (bytes == 0) continue;
    std::vector<Received> done;
    const bool was_open = open;
    absl::Status status =
        assembler.consume(cut(data + at, bytes, piece), done, on_auth);
    if (!status.ok()) {
      const bool allowed =
          status.code() == absl::StatusCode::kInvalidArgument ||
          (status.code() == absl::StatusCode::kUnauthenticated && !was_open);
      TETHER_CHECK(allowed,
                   "a malformed frame is not INVALID_ARGUMENT, nor "
                   "UNAUTHENTICATED before the gate opened");
      return 0;
    }
    for (const Received& received : done) {
      if (received.result.ok()) {
        uint64_t total = received.result->payload.size();
        for (const auto& storage : received.result->storages) {
          total += storage.nbytes();
        }
        TETHER_CHECK(total <= kMaxMessageBytes,
                     "a message larger than the limit was assembled");
      } else {
        TETHER_CHECK(received.result.status().code() != absl::StatusCode::kOk,
                     "a failed message with an OK status");
      }
    }
  }
  return 0;
}
