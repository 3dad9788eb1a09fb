// libFuzzer entry point for the wire decoder (see BUILD.bazel for the build
// line). An input is one byte describing the message's storages followed by
// the payload: bits 0-1 of the first byte give how many storages (0-3),
// bits 2-3, 4-5 and 6-7 the size of storage 0, 1 and 2 (kStorageBytes).
// fuzz_corpus/ holds seeds in that format (make_fuzz_corpus.cc writes them).
//
// Properties checked: decode never crashes, fails only with INVALID_ARGUMENT
// or RESOURCE_EXHAUSTED, and whatever it accepts encodes and decodes again.
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/message.h"
#include "core/wire/codec.h"

namespace {

constexpr int64_t kStorageBytes[4] = {0, 16, 64, 1024};

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
