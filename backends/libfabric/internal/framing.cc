#include "backends/libfabric/internal/framing.h"

#include <absl/status/status.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstring>

#include "backends/common/bytes.h"

namespace tether::backends::libfabric::internal {
namespace {

constexpr char kMagic[4] = {'T', 'L', 'F', '1'};
constexpr char kFrameName[] = "libfabric frame";

// Little-endian fields written at `out` (common/bytes.h), advancing it.
template <typename T>
void put(char*& out, T value) {
  uint8_t* at = reinterpret_cast<uint8_t*>(out);
  common::put_le(at, value);
  out = reinterpret_cast<char*>(at);
}

// A fixed-size record whose length the caller has checked: the field of
// type T at `offset`, with `offset` advanced past it.
template <typename T>
T get(absl::string_view bytes, size_t& offset) {
  const T value = common::get_le<T>(bytes, offset);
  offset += sizeof(T);
  return value;
}

absl::Status malformed(absl::string_view what) {
  return common::malformed(kFrameName, what);
}

constexpr size_t kSegmentSize = 1 + 8;
constexpr size_t kRemoteExtra = 8 + 8;

}  // namespace

uint64_t bulk_tag(uint32_t rank, uint64_t sequence) {
  return (uint64_t{2} << 60) | (static_cast<uint64_t>(rank) << 40) |
         (sequence & kSequenceMask);
}

void write_header(const FrameHeader& header, char* out) {
  std::memcpy(out, kMagic, sizeof(kMagic));
  out += sizeof(kMagic);
  put<uint8_t>(out, static_cast<uint8_t>(header.kind));
  put<uint8_t>(out, header.flags);
  put<uint16_t>(out, header.credits);
  put<uint32_t>(out, header.src_rank);
  put<uint32_t>(out, 0);
  put<uint64_t>(out, header.arg0);
  put<uint64_t>(out, header.arg1);
  put<uint64_t>(out, header.arg2);
}

absl::StatusOr<FrameHeader> read_header(absl::string_view frame) {
  if (frame.size() < kHeaderSize) {
    return malformed(absl::StrCat(frame.size(), " bytes"));
  }
  if (std::memcmp(frame.data(), kMagic, sizeof(kMagic)) != 0) {
    return malformed("bad magic");
  }
  size_t in = sizeof(kMagic);
  FrameHeader header;
  const uint8_t kind = get<uint8_t>(frame, in);
  if (kind < static_cast<uint8_t>(FrameKind::kRequest) ||
      kind > static_cast<uint8_t>(FrameKind::kAuth)) {
    return malformed(absl::StrCat("unknown kind ", kind));
  }
  header.kind = static_cast<FrameKind>(kind);
  header.flags = get<uint8_t>(frame, in);
  constexpr uint8_t kKnownFlags =
      kFlagControlSlot | kFlagReturnsControlSlot | kFlagBodyRemote;
  if ((header.flags & ~kKnownFlags) != 0) {
    return malformed(absl::StrCat("unknown flags ", header.flags));
  }
  if ((header.flags & kFlagBodyRemote) != 0 && !carries_message(header.kind)) {
    return malformed("a remote body on a control frame");
  }
  header.credits = get<uint16_t>(frame, in);
  header.src_rank = get<uint32_t>(frame, in);
  if (get<uint32_t>(frame, in) != 0) return malformed("reserved bytes set");
  header.arg0 = get<uint64_t>(frame, in);
  header.arg1 = get<uint64_t>(frame, in);
  header.arg2 = get<uint64_t>(frame, in);
  return header;
}

void write_message_head(const MessageHead& head, char* out) {
  put<int32_t>(out, static_cast<int32_t>(head.type));
  put<int32_t>(out, head.code);
  put<int64_t>(out, head.id);
  put<uint64_t>(out, head.body_size);
  put<uint64_t>(out, head.body_address);
  put<uint64_t>(out, head.body_key);
}

absl::StatusOr<MessageHead> read_message_head(absl::string_view bytes) {
  if (bytes.size() < kMessageHeadSize) {
    return malformed(absl::StrCat("message head of ", bytes.size(), " bytes"));
  }
  size_t in = 0;
  MessageHead head;
  head.type = static_cast<MessageType>(get<int32_t>(bytes, in));
  head.code = get<int32_t>(bytes, in);
  head.id = get<int64_t>(bytes, in);
  head.body_size = get<uint64_t>(bytes, in);
  head.body_address = get<uint64_t>(bytes, in);
  head.body_key = get<uint64_t>(bytes, in);
  if (head.body_size > kMaxSegmentBytes) {
    return malformed(absl::StrCat("a body of ", head.body_size, " bytes"));
  }
  return head;
}

size_t body_size(const std::vector<SegmentDesc>& segments) {
  size_t size = 4;
  for (const SegmentDesc& segment : segments) {
    size += kSegmentSize;
    if (segment.remote) {
      size += kRemoteExtra;
    } else {
      size += segment.size;
    }
  }
  return size;
}

void write_body(const std::vector<SegmentDesc>& segments,
                const std::vector<const char*>& inline_data, char* out) {
  put<uint32_t>(out, static_cast<uint32_t>(segments.size()));
  for (const SegmentDesc& segment : segments) {
    put<uint8_t>(out, segment.remote ? 1 : 0);
    put<uint64_t>(out, segment.size);
    if (segment.remote) {
      put<uint64_t>(out, segment.address);
      put<uint64_t>(out, segment.key);
    }
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].remote || segments[i].size == 0) continue;
    std::memcpy(out, inline_data[i], segments[i].size);
    out += segments[i].size;
  }
}

absl::StatusOr<Body> read_body(absl::string_view bytes) {
  common::ByteReader in(bytes, kFrameName);
  absl::StatusOr<uint32_t> count = in.read<uint32_t>("segment count");
  if (!count.ok()) return count.status();
  if (*count == 0 || *count > kMaxSegments) {
    return malformed(absl::StrCat(*count, " segments"));
  }
  // Every segment takes at least kSegmentSize bytes: a count the bytes
  // cannot hold is refused before anything is reserved for it.
  if (static_cast<uint64_t>(*count) * kSegmentSize > in.remaining()) {
    return malformed(absl::StrCat(*count, " segments in ", bytes.size(),
                                  " bytes"));
  }
  Body body;
  body.segments.reserve(*count);
  uint64_t inline_bytes = 0;
  for (uint32_t i = 0; i < *count; ++i) {
    absl::StatusOr<uint8_t> remote = in.read<uint8_t>("segment mode");
    if (!remote.ok()) return remote.status();
    if (*remote > 1) return malformed(absl::StrCat("segment mode ", *remote));
    absl::StatusOr<uint64_t> size = in.read<uint64_t>("segment size");
    if (!size.ok()) return size.status();
    SegmentDesc segment;
    segment.remote = *remote == 1;
    segment.size = *size;
    if (segment.size > kMaxSegmentBytes) {
      return malformed(absl::StrCat("a segment of ", segment.size, " bytes"));
    }
    if (segment.remote) {
      if (segment.size == 0) return malformed("an empty remote segment");
      absl::StatusOr<uint64_t> address = in.read<uint64_t>("segment address");
      if (!address.ok()) return address.status();
      absl::StatusOr<uint64_t> key = in.read<uint64_t>("segment key");
      if (!key.ok()) return key.status();
      segment.address = *address;
      segment.key = *key;
    } else {
      inline_bytes += segment.size;
    }
    body.segments.push_back(segment);
  }
  if (in.remaining() != inline_bytes) {
    return malformed(absl::StrCat("body has ", in.remaining(),
                                  " bytes of inline data for ", inline_bytes));
  }
  body.inline_data.reserve(*count);
  for (const SegmentDesc& segment : body.segments) {
    if (segment.remote) {
      body.inline_data.push_back(nullptr);
      continue;
    }
    // Cannot fail: the inline bytes were counted above.
    absl::StatusOr<absl::string_view> data =
        in.read_bytes(segment.size, "inline data");
    if (!data.ok()) return data.status();
    body.inline_data.push_back(data->data());
  }
  return body;
}

absl::Status check_limits(const Body& body, const MessageLimits& limits) {
  const uint64_t payload = body.segments.empty() ? 0 : body.segments[0].size;
  std::vector<uint64_t> storages;
  if (!body.segments.empty()) storages.reserve(body.segments.size() - 1);
  for (size_t i = 1; i < body.segments.size(); ++i) {
    storages.push_back(body.segments[i].size);
  }
  return check_message_limits(payload, storages, limits);
}

uint64_t max_body_size(const MessageLimits& limits) {
  const uint64_t segments = static_cast<uint64_t>(limits.max_storages) + 1;
  return 4 + segments * (kSegmentSize + kRemoteExtra) +
         static_cast<uint64_t>(limits.max_payload_bytes) +
         static_cast<uint64_t>(limits.max_storage_bytes);
}

std::string write_auth(const AuthFrame& frame) {
  const absl::string_view fields[3] = {frame.name, frame.challenge,
                                       frame.proof};
  std::string out(7, '\0');
  char* at = out.data();
  put<uint8_t>(at, static_cast<uint8_t>(frame.step));
  for (absl::string_view field : fields) {
    put<uint16_t>(at, static_cast<uint16_t>(
                          std::min(field.size(), kMaxAuthField)));
  }
  for (absl::string_view field : fields) {
    out.append(field.data(), std::min(field.size(), kMaxAuthField));
  }
  return out;
}

absl::StatusOr<AuthFrame> read_auth(absl::string_view tail) {
  common::ByteReader in(tail, kFrameName);
  absl::StatusOr<uint8_t> step = in.read<uint8_t>("auth step");
  if (!step.ok()) return step.status();
  if (*step < static_cast<uint8_t>(AuthStep::kClientHello) ||
      *step > static_cast<uint8_t>(AuthStep::kRefused)) {
    return malformed(absl::StrCat("auth step ", *step));
  }
  AuthFrame frame;
  frame.step = static_cast<AuthStep>(*step);
  size_t sizes[3];
  size_t total = 7;
  for (size_t& size : sizes) {
    absl::StatusOr<uint16_t> announced = in.read<uint16_t>("auth field size");
    if (!announced.ok()) return announced.status();
    size = *announced;
    if (size > kMaxAuthField) {
      return malformed(absl::StrCat("an auth field of ", size, " bytes"));
    }
    total += size;
  }
  if (total != tail.size()) {
    return malformed(absl::StrCat("an auth frame of ", tail.size(),
                                  " bytes announcing ", total));
  }
  std::string* fields[3] = {&frame.name, &frame.challenge, &frame.proof};
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<absl::string_view> field =
        in.read_bytes(sizes[i], "auth field");
    if (!field.ok()) return field.status();
    fields[i]->assign(field->data(), field->size());
  }
  return frame;
}

namespace {

absl::Status add_chunks(uint32_t segment, uint64_t size, uint64_t chunk_size,
                        std::vector<Chunk>& out) {
  if (chunk_size == 0) return malformed("chunk size 0");
  const uint64_t count = (size + chunk_size - 1) / chunk_size;
  if (count > kMaxChunks || out.size() + count > kMaxChunks) {
    return malformed(absl::StrCat("more than ", kMaxChunks, " chunks"));
  }
  for (uint64_t offset = 0; offset < size; offset += chunk_size) {
    out.push_back(Chunk{segment, offset, std::min(chunk_size, size - offset)});
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status plan_body_chunks(uint64_t body_size, uint64_t chunk_size,
                              std::vector<Chunk>& out) {
  return add_chunks(kBodySegment, body_size, chunk_size, out);
}

absl::Status plan_chunks(const std::vector<SegmentDesc>& segments,
                         uint64_t chunk_size, std::vector<Chunk>& out) {
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!segments[i].remote) continue;
    absl::Status added = add_chunks(static_cast<uint32_t>(i), segments[i].size,
                                    chunk_size, out);
    if (!added.ok()) return added;
  }
  return absl::OkStatus();
}

}  // namespace tether::backends::libfabric::internal
