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
// tensors of every non-quantized dtype (and the undefined tensor), sparse
// COO CPU tensors (indices and values travel as dense tensors; decode checks
// every index against the size and a coalesced claim against the order),
// List (the element type survives), Tuple, Dict (key and value types and
// insertion order survive), RRefs (through a ReferenceHook:
// core/wire/references.h), function references (FunctionRef), dtypes,
// layouts and memory formats (TorchEnum) and pickled objects (Pickled, or a
// front end's object through its ObjectEncoder): core/wire/capsules.h.
// Anything else is refused by encode. A message's context metadata travels
// in the envelope beside the value (core/wire/context_meta.h). The
// PROFILED_REQUEST and PROFILED_RESPONSE wrappers: core/wire/profiled.h.
//
// Views: a tensor travels as its storage whole with its sizes, strides and
// offset, so a non-contiguous view arrives the same view (as in the peer),
// unless that is wasteful: when the storage is 8 KiB or more and at least
// twice the bytes of the view's elements (the peer's rule), the view travels
// as a contiguous compact copy of its elements instead. A tensor with no
// elements travels with an empty storage.
//
// Aliasing: tensors of one message that share a storage still share it after
// decode, as long as the storage travels whole. A compacted view (above)
// travels whole anyway if another tensor of the same message ships its
// storage whole; otherwise it no longer aliases its base on the receiving
// side.
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
#include "core/wire/context_meta.h"
#include "core/wire/references.h"

namespace tether::wire {

// What decode accepts; anything over a limit is RESOURCE_EXHAUSTED. The
// defaults are generous for real traffic and keep a hostile payload from
// exhausting the stack or memory.
struct Limits {
  // Nesting of lists, tuples and dicts in values, and of container types in
  // the types the message carries (List[List[int]] is as deep as the value
  // [[1]]: 2). Every container of the message counts, the ones a layer
  // above wraps around user values included (a CALL is the tuple (name,
  // args tuple, kwargs): an argument sits 2 deep). encode and decode count
  // alike and refuse one level more than this with the same
  // RESOURCE_EXHAUSTED "... nested deeper than N (the limit max_depth ...)".
  // Values above kMaxSupportedDepth are treated as kMaxSupportedDepth.
  int max_depth = 64;
  // Total IValue nodes (containers and packed list elements included) plus
  // type descriptions.
  int64_t max_values = int64_t{1} << 22;
  // Out-of-band storages in the message.
  int64_t max_storages = int64_t{1} << 16;
  int64_t max_payload_bytes = int64_t{256} << 20;
  int64_t max_tensor_dims = 64;
  // All the storages' bytes together (checked by the Worker and the
  // backends, which see the sizes before the codec does).
  int64_t max_storage_bytes = int64_t{64} << 30;
};

// The deepest nesting either direction handles, whatever Limits say: encode
// refuses deeper values (RESOURCE_EXHAUSTED) so that a cyclic list cannot
// overflow the stack, and decode parses any payload up to this depth (then
// refuses it by its own max_depth, RESOURCE_EXHAUSTED); a payload deeper
// than any encoder makes is INVALID_ARGUMENT.
inline constexpr int kMaxSupportedDepth = 256;

// Encodes `value` into out.payload and out.storages, replacing what they held
// (out.type and out.id are left alone; `out` is untouched on error).
// INVALID_ARGUMENT names the unsupported kind and where it sits, e.g.
// "value at root[1][0]: unsupported IValue kind Object".
// RRefs in `value` need `rrefs` (INVALID_ARGUMENT without it). `autograd`,
// if given and in a context, travels in the envelope. A value nested deeper
// than limits.max_depth is RESOURCE_EXHAUSTED, as decode would find it (the
// other limits are the receiver's, checked by decode and the agents).
[[nodiscard]] absl::Status encode(const c10::IValue& value, Message& out,
                                  ReferenceHook* rrefs = nullptr,
                                  const ContextMeta* autograd = nullptr,
                                  const Limits& limits = Limits());

namespace internal {

// encode() through protobuf's messages alone, never its direct writer of
// plain values (None, bool, int, float, str, tuples, strided CPU tensors and
// keyword arguments' dicts, written without building the messages): the reference the codec's tests
// hold that writer's bytes to. internal::decode_through_messages, below
// decode, is the same for the reader.
[[nodiscard]] absl::Status encode_through_messages(
    const c10::IValue& value, Message& out, ReferenceHook* rrefs = nullptr,
    const ContextMeta* autograd = nullptr, const Limits& limits = Limits());

// decode() through protobuf's messages alone, never its direct reader of
// plain values: the reference the codec's tests hold that reader to.
[[nodiscard]] absl::StatusOr<c10::IValue> decode_through_messages(
    const Message& in, const Limits& limits = Limits(),
    ReferenceHook* rrefs = nullptr, ContextMeta* autograd = nullptr);

}  // namespace internal

// Decodes what encode produced. Never crashes on any input: malformed,
// truncated, inconsistent input is INVALID_ARGUMENT, a limit exceeded is
// RESOURCE_EXHAUSTED, each with a message naming what was wrong and where
// (e.g. "tensor at root[1]: storage index 3 out of range (2 storages)").
// The decoded tensors are views of in.storages (shared, not copied).
// RRefs in the payload need `rrefs` (INVALID_ARGUMENT without it).
// `autograd`, if given, receives the envelope's autograd metadata (left
// default when the message has none).
[[nodiscard]] absl::StatusOr<c10::IValue> decode(
    const Message& in, const Limits& limits = Limits(),
    ReferenceHook* rrefs = nullptr, ContextMeta* autograd = nullptr);

}  // namespace tether::wire

#endif  // TETHER_CORE_WIRE_CODEC_H_
