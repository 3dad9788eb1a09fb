// Writes the seed inputs of framing_corpus/ for framing_fuzz.cc (run by
// hand): real frames of every kind, in the fuzz target's input format.
//   bazel run //backends/grpc:make_framing_corpus -- \
//       $PWD/backends/grpc/internal/framing_corpus
#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "backends/grpc/internal/framing.h"

namespace {

using namespace tether::backends::grpc_internal;  // NOLINT

c10::Storage storage_of(size_t bytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes,
                      c10::GetCPUAllocator(), /*resizable=*/false);
}

std::string bytes_of(const std::vector<::grpc::Slice>& slices) {
  std::string out;
  for (const ::grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// Every frame of `message`, in 4 KiB chunks.
std::string frames_of(std::shared_ptr<const OutgoingMessage> message) {
  OutgoingCursor cursor(std::move(message));
  std::vector<::grpc::Slice> slices;
  while (!cursor.done()) cursor.append_next_frame(4096, slices);
  return bytes_of(slices);
}

// `header` is the input's first byte (see framing_fuzz.cc).
void write(const std::string& dir, const std::string& name, uint8_t header,
           const std::string& frames) {
  std::string input;
  input.push_back(static_cast<char>(header));
  input.push_back(static_cast<char>(128));
  input += frames;
  std::ofstream(dir + "/" + name, std::ios::binary) << input;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_framing_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  tether::Message small;
  small.type = tether::MessageType::kCall;
  small.id = 7;
  small.payload = "a small call";
  small.storages = {storage_of(8), storage_of(0)};
  write(dir, "request_inline", 12, frames_of(make_request(small)));
  tether::Message large = small;
  large.storages = {storage_of(3 * 4096 + 100), storage_of(20000)};
  // Two gRPC messages, cut in the middle of the chunks.
  write(dir, "request_chunked", 0x20 | 9, frames_of(make_request(large)));
  write(dir, "response", 5, frames_of(make_response(7, small)));
  write(dir, "error", 3,
        frames_of(make_response(
            7, absl::NotFoundError("no operator named 'os.system'"))));
  const std::string hello =
      bytes_of({make_auth_frame({AuthStep::kHello, "w1", std::string(32, 'c')})});
  const std::string proof =
      bytes_of({make_auth_frame({AuthStep::kProof, "w1", std::string(32, 'p')})});
  write(dir, "auth_then_request", 0x10 | 6,
        hello + proof + frames_of(make_request(small)));
  write(dir, "request_before_auth", 0x10 | 10, frames_of(make_request(small)));
  return 0;
}
