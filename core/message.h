// Message: the unit an Agent moves between workers.
//
// Used by every backend (which moves Messages and nothing else) and by the
// Worker (which gives them meaning). A Message is
// `{type, id, payload, storages}`: `payload` is the wire codec's envelope
// (core/wire), `storages` are the tensor storages it refers to. They travel
// out of band: a backend sends each storage's bytes as a buffer of its own,
// zero-copy where the fabric allows, and the receiving backend allocates a
// storage of that size for each. The codec in the payload carries only the
// metadata (dtype, sizes, strides, offset) and the index of the storage.
//
// Ownership: a Message owns its payload; its storages are shared with the
// tensors they came from (c10::Storage is reference counted), so a sender
// must not write to a tensor while its message is in flight.
#ifndef TETHER_CORE_MESSAGE_H_
#define TETHER_CORE_MESSAGE_H_

#include <absl/status/status.h>
#include <absl/types/span.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace tether {

// What a message is. Requests and responses are matched by Message::id.
// Values are part of the wire format: never renumber, only add. The values
// this enum does not name belong to the layers above core: each defines
// its own types as MessageType{N} (6 to 10, 12 to 14 and 17 are taken; a
// new type takes the next free value from 20) and names them with
// register_message_type_names, so that core moves and names them without
// knowing what they mean (core/worker_extension.h).
enum class MessageType : int32_t {
  kUnknown = 0,
  // A call of an operator or TorchScript function; payload is the tuple
  // (qualified name, args tuple, kwargs dict).
  kCall = 1,
  // The response to kCall; payload is the result.
  kCallRet = 2,
  // A response that carries an error instead of a result; payload is the
  // tuple (absl::StatusCode as int, message).
  kException = 3,
  // Liveness probes (a peer's graceful join; the Worker answers a PING on
  // the agent's thread) and agent-level test traffic: any payload.
  kPing = 4,
  kPong = 5,
  // The empty response of control messages (ack()).
  kAck = 11,
  // Dynamic membership (core/join/membership.h): a worker tells each member
  // that it joined or is leaving; payload "rank:name"; answered with kAck.
  kMemberJoin = 15,
  kMemberLeave = 16,
  // A request sent while the caller runs LibTorch's legacy profiler
  // (core/profiling.h): it wraps the request as it would travel otherwise;
  // the callee runs it under a profiler of its own and answers with a
  // PROFILED_RESPONSE wrapping its response and the events it recorded.
  // Payloads: core/wire/profiled.h (wrap_profiled_request, ...).
  kProfiledRequest = 18,
  kProfiledResponse = 19,
};

// Returns a short name for logs and error messages ("CALL", ...): a layer's
// types by the names it registered, "INVALID" for a value nobody named.
const char* message_type_name(MessageType type);

// Names a layer's own message types (e.g. {MessageType{7}, "FETCH"}) for
// message_type_name. Process-wide and idempotent; naming a value core
// names, or one a layer named otherwise, is a bug (a crash naming it).
// Returns true, so that a layer's header can name its types when it is
// first used: `inline const bool kNamed = register_message_type_names(...)`.
bool register_message_type_names(
    std::initializer_list<std::pair<MessageType, const char*>> names);

namespace internal {

// For a backend plugin, which holds its own copy of core (backends/common/
// plugin_library.h): message_type_name asks `names` (the program's
// message_type_name) for a value that no layer named in this copy, so the
// plugin's log lines name the program's layers' types.
void name_message_types_with(const char* (*names)(MessageType type));

}  // namespace internal

// What a worker accepts in one message from a peer (RpcOptions::limits,
// passed to its agent as AgentSetup::limits). A backend checks an incoming
// message's announced sizes against these before it allocates anything for
// it. A message over them is refused, not the connection: a request gets
// the RESOURCE_EXHAUSTED of check_message_limits() as its response (a
// response fails its request with it), its bytes are skipped without being
// held (read and dropped in bounded memory, or never transferred, as the
// transport allows), and the connection keeps serving. Only a peer that
// breaks the protocol loses its connection.
struct MessageLimits {
  int64_t max_payload_bytes = int64_t{256} << 20;
  int64_t max_storages = int64_t{1} << 16;
  // All the storages' bytes together.
  int64_t max_storage_bytes = int64_t{64} << 30;
};

// RESOURCE_EXHAUSTED naming the first limit of `limits` that a message of
// `payload_bytes` and storages of `storage_bytes` (one size per storage) is
// over, e.g. "a payload of 70000 bytes is over the limit max_payload_bytes
// of 65536 (RpcOptions::limits)"; OK if it is within them all.
[[nodiscard]] absl::Status check_message_limits(
    uint64_t payload_bytes, absl::Span<const uint64_t> storage_bytes,
    const MessageLimits& limits);

struct Message {
  MessageType type = MessageType::kUnknown;
  // Chosen by the sending agent for a request; copied into its response.
  int64_t id = -1;
  std::string payload;
  std::vector<c10::Storage> storages;
};

// The response of a request that answers with nothing but its success (a
// layer's control messages, a membership change): type ACK, no payload, no
// storages.
Message ack();

}  // namespace tether

#endif  // TETHER_CORE_MESSAGE_H_
