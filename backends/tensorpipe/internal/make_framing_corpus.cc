// Writes the seed inputs of framing_corpus/ for framing_fuzz.cc (run by
// hand): real frames of every kind, in the fuzz target's input format.
//   bazel run //backends/tensorpipe:make_framing_corpus -- \
//       $PWD/backends/tensorpipe/internal/framing_corpus
#include <string>

#include "backends/common/fuzz_corpus.h"
#include "backends/tensorpipe/internal/framing.h"

namespace {

using namespace tether::backends::tensorpipe::internal;  // NOLINT
using tether::backends::common::corpus_storage;
using tether::backends::common::CorpusDir;

void write(const CorpusDir& dir, const std::string& name,
           const OutgoingFrame& frame) {
  ::tensorpipe::Message message = frame.to_tensorpipe();
  const size_t payloads = message.payloads.size();
  std::string input(
      1, static_cast<char>((payloads == 0 ? 0 : 1) | (message.tensors.size() << 1) |
                           ((payloads == 0 ? 0 : payloads - 1) << 3)));
  auto put16 = [&](size_t n) {
    input.push_back(static_cast<char>(n & 0xff));
    input.push_back(static_cast<char>((n >> 8) & 0xff));
  };
  for (const auto& p : message.payloads) put16(p.length);
  for (const auto& t : message.tensors) put16(t.length);
  input += message.metadata;
  dir.write(name, input);
}

void write_seeds(const CorpusDir& dir) {
  const tether::Message small = tether::backends::common::corpus_small_call();
  write(dir, "request_inline", *make_request_frame(small));
  tether::Message big = small;
  big.payload = std::string(200, 'p');
  big.storages = {corpus_storage(kPayloadLimit + 1), corpus_storage(3),
                  corpus_storage(0)};
  write(dir, "request_out_of_band", *make_request_frame(big));
  // Storages as the pipe's payloads (flag kPayloads), shrunk to fit the
  // input's u16 lengths.
  tether::Message mid = small;
  mid.payload = std::string(40, 'p');
  mid.storages = {corpus_storage(300), corpus_storage(0), corpus_storage(5)};
  std::shared_ptr<OutgoingFrame> as_payloads = make_request_frame(mid);
  as_payloads->header.inline_data = false;
  as_payloads->header.storages_as_payloads = true;
  write(dir, "request_storages_as_payloads", *as_payloads);
  tether::Message response;
  response.type = tether::MessageType::kCallRet;
  response.payload = "result";
  response.storages = {corpus_storage(16)};
  write(dir, "response", *make_response_frame(7, response));
  write(dir, "error",
        *make_response_frame(7, absl::NotFoundError("no such function")));
  write(dir, "auth_hello",
        *make_auth_frame({AuthStep::kHello, "w0", std::string(32, 'c')}));
  write(dir, "auth_proof",
        *make_auth_frame({AuthStep::kProof, "w1", std::string(32, 'm')}));
  write(dir, "auth_refused",
        *make_auth_frame({AuthStep::kRefused, "w1", "authentication failed"}));
}

}  // namespace

int main(int argc, char** argv) {
  return tether::backends::common::corpus_main(argc, argv,
                                               "make_framing_corpus", write_seeds);
}
