#include "backends/tensorpipe/internal/framing.h"

#include <absl/strings/str_cat.h>
#include <c10/core/CPUAllocator.h>
#include <tensorpipe/common/cpu_buffer.h>
#include <tensorpipe/common/device.h>

#include <cstring>
#include <exception>
#include <utility>

#include "backends/common/bytes.h"
#include "core/toolkit/receive_buffers.h"

namespace tether::backends::tensorpipe::internal {
namespace {

using common::get_le;
using common::put_le;

constexpr char kMagic[4] = {'T', 'P', 'F', '1'};
constexpr size_t kFixedSize = 4 + 1 + 3 + 4 + 4 + 8 + 8 + 4;
constexpr uint8_t kFlagInline = 1;
constexpr uint8_t kFlagPayloads = 2;

absl::Status malformed(absl::string_view what) {
  return common::malformed("tensorpipe frame", what);
}

bool is_cpu(const ::tensorpipe::Device& device) {
  return device.type == ::tensorpipe::kCpuDeviceType;
}

}  // namespace

std::string encode_header(const FrameHeader& header, size_t room) {
  const size_t size = header_size(header);
  std::string out;
  out.reserve(size + room);
  out.resize(size);  // written in place, not a byte at a time
  uint8_t* at = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(at, kMagic, sizeof(kMagic));
  at += sizeof(kMagic);
  put_le<uint8_t>(at, static_cast<uint8_t>(header.kind));
  put_le<uint8_t>(at, (header.inline_data ? kFlagInline : 0) |
                         (header.storages_as_payloads ? kFlagPayloads : 0));
  at += 2;  // reserved, zero
  put_le<int32_t>(at, static_cast<int32_t>(header.type));
  put_le<int32_t>(at, header.code);
  put_le<int64_t>(at, header.id);
  put_le<uint64_t>(at, header.payload_size);
  put_le<uint32_t>(at, static_cast<uint32_t>(header.storage_sizes.size()));
  for (uint64_t storage : header.storage_sizes) put_le<uint64_t>(at, storage);
  return out;
}

absl::StatusOr<FrameHeader> decode_header(absl::string_view metadata) {
  if (metadata.size() < kFixedSize) {
    return malformed(absl::StrCat("header of ", metadata.size(), " bytes"));
  }
  if (std::memcmp(metadata.data(), kMagic, sizeof(kMagic)) != 0) {
    return malformed("bad magic");
  }
  FrameHeader header;
  const uint8_t kind = get_le<uint8_t>(metadata, 4);
  if (kind < static_cast<uint8_t>(FrameKind::kRequest) ||
      kind > static_cast<uint8_t>(FrameKind::kBindAck)) {
    return malformed(absl::StrCat("unknown kind ", kind));
  }
  header.kind = static_cast<FrameKind>(kind);
  const uint8_t flags = get_le<uint8_t>(metadata, 5);
  if ((flags & ~(kFlagInline | kFlagPayloads)) != 0 ||
      flags == (kFlagInline | kFlagPayloads)) {
    return malformed(absl::StrCat("unknown flags ", flags));
  }
  header.inline_data = (flags & kFlagInline) != 0;
  header.storages_as_payloads = (flags & kFlagPayloads) != 0;
  header.type = static_cast<MessageType>(get_le<int32_t>(metadata, 8));
  header.code = get_le<int32_t>(metadata, 12);
  header.id = get_le<int64_t>(metadata, 16);
  header.payload_size = get_le<uint64_t>(metadata, 24);
  const uint32_t count = get_le<uint32_t>(metadata, 32);
  if (count > kMaxStorages) {
    return malformed(absl::StrCat(count, " storages"));
  }
  const size_t fixed_and_sizes = kFixedSize + 8 * static_cast<size_t>(count);
  if (metadata.size() < fixed_and_sizes ||
      (!header.inline_data && metadata.size() != fixed_and_sizes)) {
    return malformed(absl::StrCat("header of ", metadata.size(), " bytes for ",
                                  count, " storages"));
  }
  const bool is_error = header.kind == FrameKind::kError;
  if (is_error != (header.code != 0)) {
    return malformed(absl::StrCat("status code ", header.code, " in a ",
                                  is_error ? "error" : "non-error", " frame"));
  }
  if (is_error && count != 0) return malformed("storages in an error frame");
  if (header.kind == FrameKind::kAuth &&
      (count != 0 || !header.inline_data)) {
    return malformed("an authentication frame that is not inline and bare");
  }
  if ((header.kind == FrameKind::kBind ||
       header.kind == FrameKind::kBindAck) &&
      (count != 0 || !header.inline_data ||
       header.payload_size != sizeof(uint64_t))) {
    return malformed("a bind frame that is not inline with 8 bytes");
  }
  header.storage_sizes.reserve(count);
  uint64_t inline_bytes = header.payload_size;
  for (uint32_t i = 0; i < count; ++i) {
    header.storage_sizes.push_back(
        get_le<uint64_t>(metadata, kFixedSize + 8 * i));
    if (header.inline_data) {
      if (header.storage_sizes.back() > kInlineLimit) {
        return malformed("an inline storage over the inline limit");
      }
      inline_bytes += header.storage_sizes.back();
    }
  }
  if (header.inline_data &&
      (header.payload_size > kInlineLimit ||
       metadata.size() - fixed_and_sizes != inline_bytes)) {
    return malformed(absl::StrCat("inline frame of ", metadata.size(),
                                  " bytes does not match its header"));
  }
  return header;
}

size_t header_size(const FrameHeader& header) {
  return kFixedSize + 8 * header.storage_sizes.size();
}

::tensorpipe::Message OutgoingFrame::to_tensorpipe() const {
  ::tensorpipe::Message message;
  size_t inline_bytes = 0;
  if (header.inline_data) {
    inline_bytes = payload.size();
    for (const c10::Storage& storage : storages) {
      inline_bytes += storage.nbytes();
    }
  }
  message.metadata = encode_header(header, inline_bytes);
  if (header.inline_data) {
    message.metadata.append(payload);
    for (const c10::Storage& storage : storages) {
      message.metadata.append(static_cast<const char*>(storage.data()),
                              storage.nbytes());
    }
    return message;
  }
  if (!payload.empty()) {
    ::tensorpipe::Message::Payload entry;
    // tensorpipe only reads from it.
    entry.data = const_cast<char*>(payload.data());
    entry.length = payload.size();
    message.payloads.push_back(std::move(entry));
  }
  for (const c10::Storage& storage : storages) {
    if (storage.nbytes() == 0) continue;
    if (header.storages_as_payloads) {
      ::tensorpipe::Message::Payload entry;
      entry.data = const_cast<void*>(storage.data());
      entry.length = storage.nbytes();
      message.payloads.push_back(std::move(entry));
      continue;
    }
    ::tensorpipe::Message::Tensor tensor;
    tensor.buffer = ::tensorpipe::CpuBuffer{storage.data()};
    tensor.length = storage.nbytes();
    // Named, so that the receiver's pipe does not answer the descriptor
    // with the devices it chose and the channel starts at once: without it
    // every out-of-band message pays an extra round trip before its bytes.
    tensor.targetDevice = ::tensorpipe::Device{::tensorpipe::kCpuDeviceType, 0};
    message.tensors.push_back(std::move(tensor));
  }
  return message;
}

namespace {

// The payload (the codec's envelope, some hundred bytes beside a tensor)
// and the storages are bounded apart, as decode_header() bounds them: a
// 48 KiB tensor travels inline with its envelope instead of taking the
// payloads' path (a second read of the pipe on each side).
bool fits_inline(const OutgoingFrame& frame) {
  uint64_t bytes = 0;
  for (const c10::Storage& storage : frame.storages) bytes += storage.nbytes();
  return frame.payload.size() <= kInlineLimit && bytes <= kInlineLimit;
}

// Inline, else storages as the pipe's payloads up to kPayloadLimit, else
// storages as tensors through a channel.
void choose_path(OutgoingFrame& frame) {
  frame.header.inline_data = fits_inline(frame);
  if (frame.header.inline_data) return;
  uint64_t bytes = 0;
  for (const c10::Storage& storage : frame.storages) bytes += storage.nbytes();
  frame.header.storages_as_payloads = bytes > 0 && bytes <= kPayloadLimit;
}

}  // namespace

std::shared_ptr<OutgoingFrame> make_request_frame(Message request) {
  auto frame = std::make_shared<OutgoingFrame>();
  frame->header.kind = FrameKind::kRequest;
  frame->header.type = request.type;
  frame->header.id = request.id;
  frame->header.payload_size = request.payload.size();
  for (const c10::Storage& storage : request.storages) {
    frame->header.storage_sizes.push_back(storage.nbytes());
  }
  frame->payload = std::move(request.payload);
  frame->storages = std::move(request.storages);
  choose_path(*frame);
  return frame;
}

std::shared_ptr<OutgoingFrame> make_response_frame(
    int64_t id, const absl::StatusOr<Message>& result) {
  auto frame = std::make_shared<OutgoingFrame>();
  frame->header.id = id;
  if (!result.ok()) {
    frame->header.kind = FrameKind::kError;
    frame->header.type = MessageType::kException;
    frame->header.code = static_cast<int32_t>(result.status().code());
    frame->payload = std::string(result.status().message());
  } else {
    frame->header.kind = FrameKind::kResponse;
    frame->header.type = result->type;
    frame->payload = result->payload;
    frame->storages = result->storages;
    for (const c10::Storage& storage : frame->storages) {
      frame->header.storage_sizes.push_back(storage.nbytes());
    }
  }
  frame->header.payload_size = frame->payload.size();
  choose_path(*frame);
  return frame;
}

std::shared_ptr<OutgoingFrame> make_auth_frame(const AuthFrame& auth) {
  auto frame = std::make_shared<OutgoingFrame>();
  frame->header.kind = FrameKind::kAuth;
  put_le<uint8_t>(frame->payload, static_cast<uint8_t>(auth.step));
  put_le<uint32_t>(frame->payload, static_cast<uint32_t>(auth.name.size()));
  frame->payload.append(auth.name);
  frame->payload.append(auth.data);
  frame->header.payload_size = frame->payload.size();
  frame->header.inline_data = true;
  return frame;
}

std::shared_ptr<OutgoingFrame> make_bind_frame(FrameKind kind,
                                               uint64_t nonce) {
  auto frame = std::make_shared<OutgoingFrame>();
  frame->header.kind = kind;
  put_le<uint64_t>(frame->payload, nonce);
  frame->header.payload_size = frame->payload.size();
  frame->header.inline_data = true;
  return frame;
}

uint64_t IncomingFrame::take_nonce() const {
  // decode_header() checked the size.
  return payload.size() == sizeof(uint64_t) ? get_le<uint64_t>(payload, 0)
                                            : 0;
}

absl::StatusOr<AuthFrame> IncomingFrame::take_auth() const {
  if (header.kind != FrameKind::kAuth || payload.size() < 5) {
    return malformed("not an authentication frame");
  }
  const uint8_t step = get_le<uint8_t>(payload, 0);
  const uint32_t name_size = get_le<uint32_t>(payload, 1);
  if (step < static_cast<uint8_t>(AuthStep::kHello) ||
      step > static_cast<uint8_t>(AuthStep::kRefused) ||
      name_size > payload.size() - 5) {
    return malformed("bad authentication frame");
  }
  AuthFrame auth;
  auth.step = static_cast<AuthStep>(step);
  auth.name = payload.substr(5, name_size);
  auth.data = payload.substr(5 + name_size);
  return auth;
}

void IncomingFrame::quarantine() {
  if (header.inline_data || header.storages_as_payloads) return;
  if (discard != nullptr) discard->quarantine();
  for (const c10::Storage& storage : storages) {
    tether::internal::quarantine_receive_storage(storage);
  }
}

absl::StatusOr<Message> IncomingFrame::take_result() {
  if (!refused.ok()) return refused;
  if (header.kind == FrameKind::kError) {
    auto code = static_cast<absl::StatusCode>(header.code);
    if (header.code <= 0 || header.code > 16) code = absl::StatusCode::kUnknown;
    return absl::Status(code, payload);
  }
  Message message;
  message.type = header.type;
  message.id = header.id;
  message.payload = std::move(payload);
  message.storages = std::move(storages);
  return message;
}

namespace {

// The frame of a message refused for `why`: its bytes are read into a
// DiscardRegion (nothing for an inline frame, whose bytes are in the
// descriptor already) and dropped.
absl::StatusOr<std::shared_ptr<IncomingFrame>> discard_frame(
    FrameHeader header, const ::tensorpipe::Descriptor& descriptor,
    absl::Status why) {
  auto frame = std::make_shared<IncomingFrame>();
  frame->header = std::move(header);
  frame->refused = std::move(why);
  if (frame->header.inline_data) return frame;
  uint64_t total = frame->header.payload_size;
  for (uint64_t size : frame->header.storage_sizes) {
    if (size > DiscardRegion::kMaxLength - total) {
      return frame->refused;  // more than anyone may send: drop the peer
    }
    total += size;
  }
  if (total == 0) return frame;
  absl::StatusOr<std::unique_ptr<DiscardRegion>> region =
      DiscardRegion::create(total);
  if (!region.ok()) {
    return absl::Status(frame->refused.code(),
                        absl::StrCat(frame->refused.message(), "; and ",
                                     region.status().message()));
  }
  frame->discard = *std::move(region);
  // Each buffer its own stretch of the region: they alias in memory, not
  // in address (concurrent channels write them).
  char* at = frame->discard->data();
  for (const ::tensorpipe::Descriptor::Payload& payload : descriptor.payloads) {
    frame->allocation.payloads.push_back({at});
    at += payload.length;
  }
  for (const ::tensorpipe::Descriptor::Tensor& tensor : descriptor.tensors) {
    ::tensorpipe::Allocation::Tensor entry;
    entry.buffer = ::tensorpipe::CpuBuffer{at};
    frame->allocation.tensors.push_back(std::move(entry));
    at += tensor.length;
  }
  return frame;
}

// allocate_frame() of `descriptor`'s payloads and tensors with `metadata`
// (an express frame's bytes, with a descriptor of nothing else).
absl::StatusOr<std::shared_ptr<IncomingFrame>> allocate(
    absl::string_view metadata, const ::tensorpipe::Descriptor& descriptor,
    const MessageLimits& limits) {
  absl::StatusOr<FrameHeader> header = decode_header(metadata);
  if (!header.ok()) return header.status();
  // First what the peer may not send at all (the connection cannot be
  // trusted after it), then what this side does not take (only the message
  // is refused).
  if (header->inline_data) {
    if (!descriptor.payloads.empty() || !descriptor.tensors.empty()) {
      return malformed("an inline frame with payloads or tensors");
    }
  } else {
    const size_t payloads = header->payload_size > 0 ? 1 : 0;
    if (header->storages_as_payloads) {
      size_t expected = payloads;
      for (uint64_t size : header->storage_sizes) expected += size > 0 ? 1 : 0;
      if (descriptor.payloads.size() != expected ||
          !descriptor.tensors.empty()) {
        return malformed("payloads do not match the header's storages");
      }
      size_t at = payloads;
      for (uint64_t size : header->storage_sizes) {
        if (size == 0) continue;
        if (descriptor.payloads[at++].length != size) {
          return malformed("payloads do not match the header's storages");
        }
      }
    }
    if ((!header->storages_as_payloads &&
         descriptor.payloads.size() != payloads) ||
        (payloads == 1 &&
         descriptor.payloads[0].length != header->payload_size)) {
      return malformed("payload does not match the header");
    }
    size_t tensor = 0;
    for (uint64_t size : header->storage_sizes) {
      if (size == 0 || header->storages_as_payloads) continue;
      if (tensor >= descriptor.tensors.size() ||
          descriptor.tensors[tensor].length != size) {
        return malformed("tensors do not match the header's storage sizes");
      }
      const ::tensorpipe::Descriptor::Tensor& t = descriptor.tensors[tensor];
      if (!is_cpu(t.sourceDevice) ||
          (t.targetDevice.has_value() && !is_cpu(*t.targetDevice))) {
        return malformed("a tensor is not in CPU memory");
      }
      ++tensor;
    }
    if (tensor != descriptor.tensors.size()) {
      return malformed("more tensors than the header announces");
    }
  }
  if (header->kind == FrameKind::kRequest ||
      header->kind == FrameKind::kResponse) {
    absl::Status within = check_message_limits(header->payload_size,
                                               header->storage_sizes, limits);
    if (!within.ok()) {
      return discard_frame(*std::move(header), descriptor, std::move(within));
    }
  } else if (header->payload_size >
             static_cast<uint64_t>(limits.max_payload_bytes)) {
    // An error or authentication frame this large is not a peer's honest
    // mistake.
    return absl::ResourceExhaustedError(absl::StrCat(
        "a payload of ", header->payload_size,
        " bytes is over the limit max_payload_bytes of ",
        limits.max_payload_bytes, " in a frame of kind ",
        static_cast<int>(header->kind)));
  }

  auto frame = std::make_shared<IncomingFrame>();
  if (header->inline_data) {
    const char* data = metadata.data() + header_size(*header);
    frame->payload.assign(data, header->payload_size);
    data += header->payload_size;
    frame->storages.reserve(header->storage_sizes.size());
    for (uint64_t size : header->storage_sizes) {
      frame->storages.emplace_back(c10::Storage::use_byte_size_t(),
                                   static_cast<size_t>(size),
                                   c10::GetCPUAllocator(),
                                   /*resizable=*/false);
      if (size > 0) std::memcpy(frame->storages.back().data(), data, size);
      data += size;
    }
    frame->header = *std::move(header);
    return frame;
  }
  try {
    frame->payload.resize(header->payload_size);
    frame->storages.reserve(header->storage_sizes.size());
    for (uint64_t size : header->storage_sizes) {
      // Large ones reuse buffers that received earlier tensors. Those a
      // channel receives may be written by the peer's process (the
      // cma_write channel), and are quarantined if the read fails.
      frame->storages.push_back(
          header->storages_as_payloads
              ? tether::internal::receive_storage(static_cast<size_t>(size))
              : tether::internal::writable_receive_storage(
                    static_cast<size_t>(size)));
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate an incoming message of ",
                     header->payload_size, " payload bytes and ",
                     header->storage_sizes.size(), " storages: ", e.what()));
  }
  frame->header = *std::move(header);
  if (!frame->payload.empty()) {
    frame->allocation.payloads.push_back({frame->payload.data()});
  }
  for (const c10::Storage& storage : frame->storages) {
    if (storage.nbytes() == 0) continue;
    if (frame->header.storages_as_payloads) {
      frame->allocation.payloads.push_back({storage.data()});
      continue;
    }
    ::tensorpipe::Allocation::Tensor entry;
    entry.buffer = ::tensorpipe::CpuBuffer{storage.data()};
    frame->allocation.tensors.push_back(std::move(entry));
  }
  return frame;
}

}  // namespace

absl::StatusOr<std::shared_ptr<IncomingFrame>> allocate_frame(
    const ::tensorpipe::Descriptor& descriptor, const MessageLimits& limits) {
  return allocate(descriptor.metadata, descriptor, limits);
}

absl::StatusOr<std::shared_ptr<IncomingFrame>> allocate_express_frame(
    absl::string_view bytes, const MessageLimits& limits) {
  static const ::tensorpipe::Descriptor kNothingElse;
  absl::StatusOr<std::shared_ptr<IncomingFrame>> frame =
      allocate(bytes, kNothingElse, limits);
  if (frame.ok() && !(*frame)->header.inline_data) {
    return malformed("an express frame that is not inline");
  }
  return frame;
}

}  // namespace tether::backends::tensorpipe::internal
