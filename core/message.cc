#include "core/message.h"

#include <absl/strings/str_cat.h>

#include <limits>

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

const char* message_type_name(MessageType type) {
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
    case MessageType::kRemoteCall:
      return "REMOTE_CALL";
    case MessageType::kRRefFetch:
      return "RREF_FETCH";
    case MessageType::kRRefUserDelete:
      return "RREF_USER_DELETE";
    case MessageType::kRRefForkRequest:
      return "RREF_FORK_REQUEST";
    case MessageType::kRRefChildAccept:
      return "RREF_CHILD_ACCEPT";
    case MessageType::kAck:
      return "ACK";
    case MessageType::kRRefMethodCall:
      return "RREF_METHOD_CALL";
    case MessageType::kAutogradBackward:
      return "AUTOGRAD_BACKWARD";
    case MessageType::kAutogradCleanup:
      return "AUTOGRAD_CLEANUP";
    case MessageType::kMemberJoin:
      return "MEMBER_JOIN";
    case MessageType::kMemberLeave:
      return "MEMBER_LEAVE";
    case MessageType::kAutogradBackwardRet:
      return "AUTOGRAD_BACKWARD_RET";
    case MessageType::kProfiledRequest:
      return "PROFILED_REQUEST";
    case MessageType::kProfiledResponse:
      return "PROFILED_RESPONSE";
  }
  return "INVALID";
}

}  // namespace tether
