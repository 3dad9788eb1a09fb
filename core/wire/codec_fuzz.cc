// libFuzzer entry point for the wire decoder (see BUILD.bazel for the build
// line). An input is one byte describing the message's storages followed by
// the payload: bits 0-1 of the first byte give how many storages (0-3),
// bits 2-3, 4-5 and 6-7 the size of storage 0, 1 and 2 (kStorageBytes).
// fuzz_corpus/ holds seeds in that format (make_fuzz_corpus.cc writes them).
//
// Properties checked: decode never crashes, fails only with INVALID_ARGUMENT
// or RESOURCE_EXHAUSTED, and whatever it accepts encodes and decodes again.
// The same of the payload read as a PROFILED_REQUEST and as a
// PROFILED_RESPONSE (unwrap_profiled_*): what they accept wraps again into
// what unwraps to the same message.
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/message.h"
#include "core/wire/codec.h"
#include "core/wire/profiled.h"

namespace {

constexpr int64_t kStorageBytes[4] = {0, 16, 64, 1024};

void check_failure(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kResourceExhausted) {
    std::abort();
  }
}

void check_profiled_wrappers(const tether::Message& message) {
  tether::wire::ProfilerSettings settings;
  absl::StatusOr<tether::Message> request =
      tether::wire::unwrap_profiled_request(message, settings);
  if (!request.ok()) {
    check_failure(request.status());
  } else {
    absl::StatusOr<tether::Message> again =
        tether::wire::wrap_profiled_request(*request, settings);
    if (!again.ok()) std::abort();
    tether::wire::ProfilerSettings read;
    absl::StatusOr<tether::Message> back =
        tether::wire::unwrap_profiled_request(*again, read);
    if (!back.ok() || back->type != request->type ||
        back->payload != request->payload ||
        read.record_shapes != settings.record_shapes ||
        read.profile_memory != settings.profile_memory) {
      std::abort();
    }
  }
  std::vector<tether::wire::ProfiledEvent> events;
  absl::StatusOr<tether::Message> response =
      tether::wire::unwrap_profiled_response(message, events);
  if (!response.ok()) {
    check_failure(response.status());
    return;
  }
  absl::StatusOr<tether::Message> again =
      tether::wire::wrap_profiled_response(*response, events);
  if (!again.ok()) std::abort();
  std::vector<tether::wire::ProfiledEvent> read;
  absl::StatusOr<tether::Message> back =
      tether::wire::unwrap_profiled_response(*again, read);
  if (!back.ok() || back->payload != response->payload ||
      read.size() != events.size()) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  tether::Message message;
  const uint8_t layout = data[0];
  for (int i = 0; i < (layout & 3); ++i) {
    const int64_t bytes = kStorageBytes[(layout >> (2 + 2 * i)) & 3];
    at::Tensor buffer = at::empty({bytes}, at::kByte);
    if (bytes > 0) buffer.fill_(static_cast<int64_t>(i + 1));
    message.storages.push_back(buffer.storage());
  }
  message.payload.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  check_profiled_wrappers(message);

  absl::StatusOr<c10::IValue> decoded = tether::wire::decode(message);
  if (!decoded.ok()) {
    if (decoded.status().code() != absl::StatusCode::kInvalidArgument &&
        decoded.status().code() != absl::StatusCode::kResourceExhausted) {
      std::abort();
    }
    return 0;
  }
  tether::Message again;
  if (!tether::wire::encode(*decoded, again).ok()) std::abort();
  if (!tether::wire::decode(again).ok()) std::abort();
  return 0;
}
