// Fuzz target for the libfabric backend's frame decoder: what one eager
// frame from a peer can make the decoders of internal/framing.h do, in the
// order the agent applies them (header; then an auth frame, or a message
// head and an inline body or a remote body's chunk plan; the limits before
// anything is allocated). An input is one whole frame as it lands in an
// eager buffer. The framing_corpus/ seeds are real frames
// (make_framing_corpus.cc writes them).
//
// Properties checked: no decoder crashes; each fails only with
// INVALID_ARGUMENT, and the limits only with RESOURCE_EXHAUSTED; what
// decodes encodes back to the same bytes (auth frames, message heads,
// bodies); a chunk plan for a message within the limits below stays small.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/libfabric/internal/framing.h"
#include "core/toolkit/check.h"

namespace {

namespace framing = tether::backends::libfabric::internal;

void expect_invalid(const absl::Status& status) {
  TETHER_CHECK(status.code() == absl::StatusCode::kInvalidArgument,
               "a decoder failed with other than INVALID_ARGUMENT");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<framing::FrameHeader> header = framing::read_header(bytes);
  if (!header.ok()) {
    expect_invalid(header.status());
    return 0;
  }
  const absl::string_view rest = bytes.substr(framing::kHeaderSize);
  if (header->kind == framing::FrameKind::kAuth) {
    absl::StatusOr<framing::AuthFrame> auth = framing::read_auth(rest);
    if (!auth.ok()) {
      expect_invalid(auth.status());
      return 0;
    }
    TETHER_CHECK(framing::write_auth(*auth) == rest,
                 "an auth frame does not encode back to its bytes");
    return 0;
  }
  if (!framing::carries_message(header->kind)) return 0;

  tether::MessageLimits limits;
  limits.max_payload_bytes = 1 << 20;
  limits.max_storages = 64;
  limits.max_storage_bytes = 1 << 20;
  absl::StatusOr<framing::MessageHead> head = framing::read_message_head(rest);
  if (!head.ok()) {
    expect_invalid(head.status());
    return 0;
  }
  std::string head_bytes(framing::kMessageHeadSize, '\0');
  framing::write_message_head(*head, head_bytes.data());
  TETHER_CHECK(head_bytes == rest.substr(0, framing::kMessageHeadSize),
               "a message head does not encode back to its bytes");

  // The agent's own bounds on a transfer's chunk size (its upper bound is
  // the provider's largest message; 16 MiB stands in for it).
  const uint64_t chunk_size = header->arg2;
  const bool chunks_ok = chunk_size >= framing::kMinChunkSize &&
                         chunk_size <= (uint64_t{16} << 20);
  std::vector<framing::Chunk> chunks;
  if (header->flags & framing::kFlagBodyRemote) {
    if (head->body_size > framing::max_body_size(limits) || !chunks_ok)
      return 0;
    absl::Status planned =
        framing::plan_body_chunks(head->body_size, chunk_size, chunks);
    TETHER_CHECK(planned.ok(), "no chunk plan for a body within the limits");
    TETHER_CHECK(
        chunks.size() <=
            framing::max_body_size(limits) / framing::kMinChunkSize + 1,
        "a chunk plan larger than the limits allow");
    return 0;
  }
  const absl::string_view body_bytes = rest.substr(framing::kMessageHeadSize);
  absl::StatusOr<framing::Body> body = framing::read_body(body_bytes);
  if (!body.ok()) {
    expect_invalid(body.status());
    return 0;
  }
  std::string again(framing::body_size(body->segments), '\0');
  framing::write_body(body->segments, body->inline_data, again.data());
  TETHER_CHECK(again == body_bytes, "a body does not encode back to its bytes");
  absl::Status within = framing::check_limits(*body, limits);
  if (!within.ok()) {
    TETHER_CHECK(within.code() == absl::StatusCode::kResourceExhausted,
                 "a limit refused with other than RESOURCE_EXHAUSTED");
    return 0;
  }
  if (!chunks_ok) return 0;
  absl::Status planned =
      framing::plan_chunks(body->segments, chunk_size, chunks);
  TETHER_CHECK(planned.ok(), "no chunk plan for a decoded body");
  // At most one chunk per kMinChunkSize of storage and payload, plus one
  // per segment.
  TETHER_CHECK(chunks.size() <= (2u << 20) / framing::kMinChunkSize + 65,
               "more chunks than storage, payload and segments need");
  return 0;
}
