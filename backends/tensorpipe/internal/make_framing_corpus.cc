// Writes the seed inputs of framing_corpus/ for framing_fuzz.cc (run by
// hand): real frames of every kind, in the fuzz target's input format.
//   bazel run //backends/tensorpipe:make_framing_corpus -- \
//       $PWD/backends/tensorpipe/internal/framing_corpus
#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "backends/tensorpipe/internal/framing.h"

namespace {

using namespace tether::backends::internal;  // NOLINT

c10::Storage storage_of(size_t bytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes,
                      c10::GetCPUAllocator(), /*resizable=*/false);
}

void write(const std::string& dir, const std::string& name,
           const OutgoingFrame& frame) {
  ::tensorpipe::Message message = frame.to_tensorpipe();
  std::string input(1, static_cast<char>((message.payloads.empty() ? 0 : 1) |
                                         (message.tensors.size() << 1)));
  auto put16 = [&](size_t n) {
    input.push_back(static_cast<char>(n & 0xff));
    input.push_back(static_cast<char>((n >> 8) & 0xff));
  };
  for (const auto& p : message.payloads) put16(p.length);
  for (const auto& t : message.tensors) put16(t.length);
  input += message.metadata;
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
  write(dir, "request_inline", *make_request_frame(small));
  tether::Message big = small;
  big.payload = std::string(200, 'p');
  big.storages = {storage_of(kInlineLimit + 1), storage_of(3), storage_of(0)};
  write(dir, "request_out_of_band", *make_request_frame(big));
  tether::Message response;
  response.type = tether::MessageType::kCallRet;
  response.payload = "result";
  response.storages = {storage_of(16)};
  write(dir, "response", *make_response_frame(7, response));
  write(dir, "error",
        *make_response_frame(7, absl::NotFoundError("no such function")));
  write(dir, "auth_hello",
        *make_auth_frame({AuthStep::kHello, "w0", std::string(32, 'c')}));
  write(dir, "auth_proof",
        *make_auth_frame({AuthStep::kProof, "w1", std::string(32, 'm')}));
  write(dir, "auth_refused",
        *make_auth_frame({AuthStep::kRefused, "w1", "authentication failed"}));
  return 0;
}
