#include "core/message.h"

namespace tether {

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
  }
  return "INVALID";
}

}  // namespace tether
