// Writes the seed inputs of framing_corpus/ for framing_fuzz.cc (run by hand):
// real eager frames of every kind, as they land in a receiver's buffer.
//   bazel run //backends/libfabric:make_framing_corpus -- \
//       $PWD/backends/libfabric/internal/framing_corpus
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "backends/libfabric/internal/framing.h"

namespace {

using namespace tether::backends::libfabric::internal;  // NOLINT

void write(const std::string& dir, const std::string& name,
           const FrameHeader& header, const std::string& tail) {
  std::string frame(kHeaderSize, '\0');
  write_header(header, frame.data());
  frame += tail;
  std::ofstream(dir + "/" + name, std::ios::binary) << frame;
}

std::string message(const MessageHead& head,
                    const std::vector<SegmentDesc>& segments,
                    const std::vector<std::string>& data) {
  MessageHead sized = head;
  sized.body_size = body_size(segments);
  std::string out(kMessageHeadSize, '\0');
  write_message_head(sized, out.data());
  std::vector<const char*> pointers;
  for (const std::string& bytes : data) pointers.push_back(bytes.data());
  std::string body(body_size(segments), '\0');
  write_body(segments, pointers, body.data());
  return out + body;
}

SegmentDesc inline_segment(uint64_t size) {
  SegmentDesc segment;
  segment.size = size;
  return segment;
}

SegmentDesc remote_segment(uint64_t size) {
  SegmentDesc segment;
  segment.size = size;
  segment.remote = true;
  segment.address = 0x7f0000001000;
  segment.key = 42;
  return segment;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_framing_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  FrameHeader header;
  header.src_rank = 1;
  header.credits = 3;
  MessageHead head;
  head.type = tether::MessageType::kCall;
  head.id = 7;

  header.kind = FrameKind::kRequest;
  write(dir, "request_inline", header,
        message(head, {inline_segment(12), inline_segment(8), inline_segment(0)},
                {"a small call", "01234567", ""}));
  header.arg0 = 5;  // a transfer
  header.arg1 = 100;
  header.arg2 = 1 << 20;
  write(dir, "request_rendezvous", header,
        message(head, {inline_segment(4), remote_segment(3 << 20)},
                {"call", ""}));
  header.flags = kFlagBodyRemote;
  MessageHead remote = head;
  remote.body_size = 30000;
  remote.body_address = 0x7f0000002000;
  remote.body_key = 43;
  std::string remote_head(kMessageHeadSize, '\0');
  write_message_head(remote, remote_head.data());
  write(dir, "request_remote_body", header, remote_head);
  header.flags = 0;
  header.arg0 = header.arg1 = header.arg2 = 0;

  header.kind = FrameKind::kResponse;
  write(dir, "response", header,
        message(head, {inline_segment(4), inline_segment(16)},
                {"done", std::string(16, 'x')}));
  header.kind = FrameKind::kError;
  MessageHead error = head;
  error.code = 5;
  write(dir, "error", header,
        message(error, {inline_segment(9)}, {"not found"}));

  header.kind = FrameKind::kAuth;
  write(dir, "auth_hello", header,
        write_auth({AuthStep::kClientHello, "w0", std::string(32, 'c'), ""}));
  write(dir, "auth_server_proof", header,
        write_auth({AuthStep::kServerProof, "w1", "", std::string(32, 'p')}));
  write(dir, "auth_refused", header,
        write_auth({AuthStep::kRefused, "w1", "", "authentication failed"}));

  header.flags = kFlagControlSlot;
  header.kind = FrameKind::kClearToSend;
  header.arg0 = 5;
  header.arg1 = 0;
  header.arg2 = 3;
  write(dir, "clear_to_send", header, "");
  header.kind = FrameKind::kCredit;
  header.arg0 = header.arg2 = 0;
  write(dir, "credit", header, "");
  return 0;
}
