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
  }
  return "INVALID";
}

}  // namespace tether
