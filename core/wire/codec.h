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
// insertion order survive), RRefs (through ReferenceHook), function references
// (FunctionRef), dtypes, layouts and memory formats (TorchEnum) and pickled
// objects (Pickled, or a front end's object through its ObjectEncoder).
// Anything else is refused by encode.
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
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/message.h"

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

// A function or class passed as a value, by name: in an IValue, a capsule
// (IValue::make_capsule) holding a FunctionRef. The codec moves the name
// (never empty); the receiver resolves it under its own policy (the Python
// front end: python/tether/rpc/_callee.py, docs/security.md).
struct FunctionRef : torch::CustomClassHolder {
  explicit FunctionRef(std::string name) : name(std::move(name)) {}
  const std::string name;

  static c10::IValue make(std::string name) {
    return c10::IValue::make_capsule(
        c10::make_intrusive<FunctionRef>(std::move(name)));
  }
  // The FunctionRef `v` holds, or nullptr.
  static const FunctionRef* of(const c10::IValue& v) {
    if (!v.isCapsule()) return nullptr;
    return dynamic_cast<const FunctionRef*>(v.toCapsule().get());
  }
};

// A torch.dtype, torch.layout or torch.memory_format passed as a value: in
// an IValue, a capsule holding a TorchEnum (c10 keeps these as plain ints,
// which would arrive as ints). `value` is the c10::ScalarType, c10::Layout
// or c10::MemoryFormat, as an int.
struct TorchEnum : torch::CustomClassHolder {
  enum class Kind { kDtype, kLayout, kMemoryFormat };
  TorchEnum(Kind kind, int64_t value) : kind(kind), value(value) {}
  const Kind kind;
  const int64_t value;

  static c10::IValue make(Kind kind, int64_t value) {
    return c10::IValue::make_capsule(
        c10::make_intrusive<TorchEnum>(kind, value));
  }
  // The TorchEnum `v` holds, or nullptr.
  static const TorchEnum* of(const c10::IValue& v) {
    if (!v.isCapsule()) return nullptr;
    return dynamic_cast<const TorchEnum*>(v.toCapsule().get());
  }
};

// An object that is not a wire value, pickled by a front end (Python:
// python/tether/rpc/_pickle.py): in an IValue, a capsule holding a Pickled.
// `data` is the pickle; `objects` are the values it refers to by index
// (persistent ids) instead of holding them: tensors, which travel out of
// band, and RRefs, which fork as any RRef does. The codec moves both and
// never looks inside `data`; the receiver unpickles it under its own policy
// (docs/security.md).
struct Pickled : torch::CustomClassHolder {
  Pickled(std::string data, std::vector<c10::IValue> objects)
      : data(std::move(data)), objects(std::move(objects)) {}
  const std::string data;
  const std::vector<c10::IValue> objects;

  static c10::IValue make(std::string data, std::vector<c10::IValue> objects) {
    return c10::IValue::make_capsule(
        c10::make_intrusive<Pickled>(std::move(data), std::move(objects)));
  }
  // The Pickled `v` holds, or nullptr.
  static const Pickled* of(const c10::IValue& v) {
    if (!v.isCapsule()) return nullptr;
    return dynamic_cast<const Pickled*>(v.toCapsule().get());
  }
};

// Turns a front end's object (IValue::isPyObject: the Python front end keeps
// a function's result so until it travels) into a Pickled value when encode
// meets one. Registered once by the front end (tether._C); without one, or
// when it fails, encode refuses the object with its Status. Called on the
// encoding thread; it must take whatever lock its language needs (the GIL).
using ObjectEncoder = absl::StatusOr<c10::IValue> (*)(const c10::IValue& object);
void set_object_encoder(ObjectEncoder encoder);

// An RRef's wire form. The codec moves it; the RRef layer gives it meaning.
struct RRefForkData {
  int32_t owner = -1;
  // The RRef's global id: the worker that created it and a local number.
  int32_t rref_worker = -1;
  int64_t rref_local = -1;
  // The id of the fork (user reference) this message creates.
  int32_t fork_worker = -1;
  int64_t fork_local = -1;
  // The worker that sent (forked) it.
  int32_t parent = -1;
  // The type of the referenced value.
  c10::TypePtr type;
};

// The side of the codec for references (c10 RRefs), given by the layer that
// gives them meaning (WorkerExtension::reference_hook; core/wire knows no
// protocol). Called during encode() and decode() on the calling thread.
class ReferenceHook {
 public:
  virtual ~ReferenceHook() = default;
  // An RRef leaving in a message: records the fork and returns its form.
  [[nodiscard]] virtual absl::StatusOr<RRefForkData> fork(
      const c10::intrusive_ptr<c10::RRefInterface>& rref) = 0;
  // An RRef arriving in a message: the local reference it becomes.
  [[nodiscard]] virtual absl::StatusOr<c10::intrusive_ptr<c10::RRefInterface>>
  adopt(const RRefForkData& data) = 0;
};

// The deepest nesting either direction handles, whatever Limits say: encode
// refuses deeper values (RESOURCE_EXHAUSTED) so that a cyclic list cannot
// overflow the stack, and decode parses any payload up to this depth (then
// refuses it by its own max_depth, RESOURCE_EXHAUSTED); a payload deeper
// than any encoder makes is INVALID_ARGUMENT.
inline constexpr int kMaxSupportedDepth = 256;

// A message's place in a context of a layer above (ContextHook,
// core/worker_extension.h; distributed autograd gives it meaning): the
// context it belongs to, the id pairing the sender's send node with the
// receiver's recv node (-1 when the message carries no tensor that requires
// grad), and the sending worker's id. context_id -1: not in a context.
struct ContextMeta {
  int64_t context_id = -1;
  int64_t message_id = -1;
  int32_t from = -1;

  bool in_context() const { return context_id >= 0; }
};

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

// ---- The payloads of PROFILED_REQUEST and PROFILED_RESPONSE ----
// (core/message.h; core/profiling.h gives them meaning.) Each wraps a
// message as it would travel otherwise: its type and payload go into the
// wrapper's payload, its id and storages stay the wrapper's.

// What the caller's profiler records (LibTorch's ProfilerConfig, CPU).
struct ProfilerSettings {
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
  bool with_modules = false;
};

// One event of LibTorch's legacy profiler as it travels.
struct ProfiledEvent {
  // 0 mark, 1 push (a range begins), 2 pop (it ends), 3 memory allocation.
  int kind = 0;
  std::string name;
  uint64_t thread_id = 0;
  // Pairs a push with its pop.
  uint64_t handle = 0;
  std::vector<std::vector<int64_t>> shapes;
  // The rank of the worker that recorded it.
  int32_t node_id = -1;
  int64_t cpu_memory_usage = 0;
  // Nanoseconds of the recording worker's clock; positive.
  int64_t cpu_ns = 0;
};

inline constexpr int kMaxProfiledEventKind = 3;

// `inner` (a request) as a PROFILED_REQUEST run with `settings`.
[[nodiscard]] absl::StatusOr<Message> wrap_profiled_request(
    Message inner, const ProfilerSettings& settings);
// The request a PROFILED_REQUEST wraps, and its settings. Never crashes:
// a malformed payload is INVALID_ARGUMENT naming what is wrong, one over
// `limits` RESOURCE_EXHAUSTED. The inner type is the caller's to check.
[[nodiscard]] absl::StatusOr<Message> unwrap_profiled_request(
    Message in, ProfilerSettings& settings, const Limits& limits = Limits());
// `inner` (a response) as a PROFILED_RESPONSE carrying `events`.
[[nodiscard]] absl::StatusOr<Message> wrap_profiled_response(
    Message inner, const std::vector<ProfiledEvent>& events);
// The response a PROFILED_RESPONSE wraps, and its events, each checked
// (a known kind, a positive time, shapes within limits.max_tensor_dims).
[[nodiscard]] absl::StatusOr<Message> unwrap_profiled_response(
    Message in, std::vector<ProfiledEvent>& events,
    const Limits& limits = Limits());

}  // namespace tether::wire

#endif  // TETHER_CORE_WIRE_CODEC_H_
