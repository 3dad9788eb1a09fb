// Writes the seed inputs of framing_corpus/ for framing_fuzz.cc (run by
// hand): real frames of every kind, in the fuzz target's input format.
//   bazel run //backends/grpc:make_framing_corpus -- \
//       $PWD/backends/grpc/internal/framing_corpus
#include <string>
#include <vector>

#include "backends/common/fuzz_corpus.h"
#include "backends/grpc/internal/framing.h"

namespace {

using namespace tether::backends::grpc::internal;  // NOLINT
using tether::backends::common::corpus_storage;
using tether::backends::common::CorpusDir;

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
void write(const CorpusDir& dir, const std::string& name, uint8_t header,
           const std::string& frames) {
  std::string input;
  input.push_back(static_cast<char>(header));
  input.push_back(static_cast<char>(128));
  input += frames;
  dir.write(name, input);
}

void write_seeds(const CorpusDir& dir) {
  const tether::Message small = tether::backends::common::corpus_small_call();
  write(dir, "request_inline", 12, frames_of(make_request(small)));
  tether::Message large = small;
  large.storages = {corpus_storage(3 * 4096 + 100), corpus_storage(20000)};
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
}

}  // namespace

int main(int argc, char** argv) {
  return tether::backends::common::corpus_main(argc, argv,
                                               "make_framing_corpus", write_seeds);
}
