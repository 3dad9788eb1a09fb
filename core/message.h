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
#include <string>
#include <vector>

namespace tether {

// What a message is. Requests and responses are matched by Message::id.
// Values are part of the wire format: never renumber, only add.
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
  // The RRef protocol (rref/). Payloads are tuples; see rref/rref_impl.h.
  kRemoteCall = 6,       // run a function, keep its result as an OwnerRRef
  kRRefFetch = 7,        // a user asks the owner for the value
  kRRefUserDelete = 8,   // a user tells the owner it is gone
  kRRefForkRequest = 9,  // a new user asks the owner to register it
  kRRefChildAccept = 10, // the owner confirmed a child: its parent may let go
  kAck = 11,             // the empty response of the control messages
  kRRefMethodCall = 12,  // run a method of the object an RRef holds
  // Distributed autograd (autograd/). Payloads are tuples; see autograd.cc.
  kAutogradBackward = 13,  // gradients for a send node: run a pass from it
  kAutogradCleanup = 14,   // a context was left: forget it, tell its peers
  // Dynamic membership (core/join/membership.h): a worker tells each member
  // that it joined or is leaving; payload "rank:name"; answered with kAck.
  kMemberJoin = 15,
  kMemberLeave = 16,
  // The response to kAutogradBackward when its pass has gradients for the
  // requester's own recv nodes (autograd/): they ride back in it instead of
  // a BACKWARD of their own. Otherwise that response is kAck.
  kAutogradBackwardRet = 17,
  // A request sent while the caller runs LibTorch's legacy profiler
  // (core/profiling.h): it wraps the request as it would travel otherwise;
  // the callee runs it under a profiler of its own and answers with a
  // PROFILED_RESPONSE wrapping its response and the events it recorded.
  // Payloads: core/wire/codec.h (ProfiledRequest, ProfiledResponse).
  kProfiledRequest = 18,
  kProfiledResponse = 19,
};

// Returns a short name for logs and error messages ("CALL", ...).
const char* message_type_name(MessageType type);

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

// The response of a request that answers with nothing but its success (the
// RRef protocol's control messages, a distributed autograd step or
// cleanup, a membership change): type ACK, no payload, no storages.
Message ack();

}  // namespace tether

#endif  // TETHER_CORE_MESSAGE_H_
