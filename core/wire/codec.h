// The wire codec: turns an IValue tree into a Message's payload and storages,
// and back.
//
// Used by the Worker to build and read every Message (call arguments,
// results, exceptions), never by backends, which move payload and storages
// without looking inside. The payload is a small versioned protobuf envelope
// (core/wire/wire.proto), not pickle: it carries the value tree and each
// tensor's metadata (dtype, sizes, strides, storage offset, requires_grad)
// plus the index of the tensor's storage in Message::storages. Storage bytes
// travel out of band, zero copy where possible.
//
// Supported: None, bool, int, float, complex, str, cpu Device, strided CPU
// tensors of every non-quantized dtype (and the undefined tensor), List (the
// element type survives), Tuple, Dict (key and value types and insertion
// order survive). Anything else is refused by encode.
//
// Aliasing: tensors of one message that share a storage still share it after
// decode, as long as the storage travels whole. A tensor that is a small view
// of a larger storage travels as a compact copy instead (unless another tensor
// of the same message ships that storage whole anyway), so it no longer
// aliases its base on the receiving side.
//
// Ownership: encode shares the tensors' storages with the Message, so the
// sender must not write to those tensors while the message is in flight.
// decode's tensors share Message::storages, with no copy.
//
// Thread safety: both functions are pure; call them from any thread.
#ifndef TETHER_CORE_WIRE_CODEC_H_
#define TETHER_CORE_WIRE_CODEC_H_

#include <ATen/core/ivalue.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/message.h"

namespace tether::wire {

// What decode accepts; anything over a limit is RESOURCE_EXHAUSTED. The
// defaults are generous for real traffic and keep a hostile payload from
// exhausting the stack or memory.
struct Limits {
  // Nesting of lists, tuples, dicts and optionals, in values and in types.
  // Values above kMaxSupportedDepth are treated as kMaxSupportedDepth.
  int max_depth = 64;
  // Total IValue nodes (containers and packed list elements included) plus
  // type descriptions.
  int64_t max_values = int64_t{1} << 22;
  // Out-of-band storages in the message.
  int64_t max_storages = int64_t{1} << 16;
  int64_t max_payload_bytes = int64_t{256} << 20;
  int64_t max_tensor_dims = 64;
};

// The deepest nesting either direction handles; encode refuses deeper values
// (RESOURCE_EXHAUSTED) so that a cyclic list cannot overflow the stack.
inline constexpr int kMaxSupportedDepth = 256;

// Encodes `value` into out.payload and out.storages, replacing what they held
// (out.type and out.id are left alone; `out` is untouched on error).
// INVALID_ARGUMENT names the unsupported kind and where it sits, e.g.
// "value at root[1][0]: unsupported IValue kind Object".
[[nodiscard]] absl::Status encode(const c10::IValue& value, Message& out);

// Decodes what encode produced. Never crashes on any input: malformed,
// truncated, inconsistent input is INVALID_ARGUMENT, a limit exceeded is
// RESOURCE_EXHAUSTED, each with a message naming what was wrong and where
// (e.g. "tensor at root[1]: storage index 3 out of range (2 storages)").
// The decoded tensors are views of in.storages (shared, not copied).
[[nodiscard]] absl::StatusOr<c10::IValue> decode(
    const Message& in, const Limits& limits = Limits());

}  // namespace tether::wire

#endif  // TETHER_CORE_WIRE_CODEC_H_
