#include "core/message.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>

#include <atomic>
#include <limits>

#include "core/toolkit/check.h"

namespace tether {

absl::Status check_message_limits(uint64_t payload_bytes,
                                  absl::Span<const uint64_t> storage_bytes,
                                  const MessageLimits& limits) {
  if (payload_bytes > static_cast<uint64_t>(limits.max_payload_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a payload of ", payload_bytes,
        " bytes is over the limit max_payload_bytes of ",
        limits.max_payload_bytes, " (RpcOptions::limits)"));
  }
  if (storage_bytes.size() > static_cast<uint64_t>(limits.max_storages)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        storage_bytes.size(), " tensor storages are over the limit max_storages of ",
        limits.max_storages, " (RpcOptions::limits)"));
  }
  // Saturating: a hostile peer may announce sizes that overflow.
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t total = 0;
  for (uint64_t bytes : storage_bytes) {
    total = bytes > kMax - total ? kMax : total + bytes;
  }
  if (total > static_cast<uint64_t>(limits.max_storage_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        total == kMax ? "2^64 or more" : absl::StrCat(total),
        " bytes of tensor storages are over the limit max_storage_bytes of ",
        limits.max_storage_bytes, " (RpcOptions::limits)"));
  }
  return absl::OkStatus();
}

Message ack() {
  Message message;
  message.type = MessageType::kAck;
  return message;
}

namespace {

const char* core_type_name(MessageType type) {
  switch (type) {
    case MessageType::kUnknown:
      return "UNKNOWN";
    case MessageType::kCall:
      return "CALL";
    case MessageType::kCallRet:
      return "CALL_RET";
    case MessageType::kException:
      return "EXCEPTION";
    case MessageType::kPing:
      return "PING";
    case MessageType::kPong:
      return "PONG";
    case MessageType::kAck:
      return "ACK";
    case MessageType::kMemberJoin:
      return "MEMBER_JOIN";
    case MessageType::kMemberLeave:
      return "MEMBER_LEAVE";
    case MessageType::kProfiledRequest:
      return "PROFILED_REQUEST";
    case MessageType::kProfiledResponse:
      return "PROFILED_RESPONSE";
  }
  return nullptr;
}

// The layers' names by value, registered once each and never removed: a
// name message_type_name returns lives as long as the process. Read without
// a lock (every message's log line may ask).
constexpr int32_t kMaxLayerType = 256;
std::atomic<const char*> layer_names[kMaxLayerType];
// The program's names, in a backend plugin's copy (name_message_types_with).
std::atomic<const char* (*)(MessageType)> names_elsewhere{nullptr};

}  // namespace

bool register_message_type_names(
    std::initializer_list<std::pair<MessageType, const char*>> names) {
  for (const auto& [type, name] : names) {
    const auto value = static_cast<int32_t>(type);
    TETHER_CHECK(name != nullptr && core_type_name(type) == nullptr &&
                     value >= 0 && value < kMaxLayerType,
                 "a layer's message type without a name, named by core or "
                 "out of range");
    const char* expected = nullptr;
    TETHER_CHECK(layer_names[value].compare_exchange_strong(expected, name) ||
                     absl::string_view(expected) == name,
                 "a message type named twice under two names");
  }
  return true;
}

const char* message_type_name(MessageType type) {
  if (const char* name = core_type_name(type)) return name;
  const auto value = static_cast<int32_t>(type);
  const char* name = value >= 0 && value < kMaxLayerType
                         ? layer_names[value].load(std::memory_order_acquire)
                         : nullptr;
  if (name != nullptr) return name;
  const auto elsewhere = names_elsewhere.load(std::memory_order_acquire);
  return elsewhere != nullptr ? elsewhere(type) : "INVALID";
}

void internal::name_message_types_with(
    const char* (*names)(MessageType type)) {
  names_elsewhere.store(names, std::memory_order_release);
}

}  // namespace tether
