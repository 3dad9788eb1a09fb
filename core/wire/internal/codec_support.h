// What the codec's parts share (codec.cc's encoder and decoder, the
// dtype tables and the type rules, the profiled wrappers): the path of a
// value for error messages, the error builders, the depth rule, the
// envelope's arena, and the declarations of the tables and type rules.
// Private to core/wire.
#ifndef TETHER_CORE_WIRE_INTERNAL_CODEC_SUPPORT_H_
#define TETHER_CORE_WIRE_INTERNAL_CODEC_SUPPORT_H_

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/core/ScalarType.h>
#include <google/protobuf/arena.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/wire/capsules.h"
#include "core/wire/codec.h"
#include "core/wire/wire.pb.h"

namespace tether::wire::codec_internal {

// The generated messages share the namespace tether::wire; pb:: marks them.
namespace pb = ::tether::wire;

// Bumped when an older decoder would misread what a newer encoder writes.
constexpr uint32_t kWireVersion = 1;

// Where a value sits in the tree, for error messages: a chain of stack
// frames, formatted only when something goes wrong.
class Path {
 public:
  static Path root() { return Path(nullptr, Kind::kRoot, 0, {}); }

  // The i-th element of a list or tuple.
  Path index(int64_t i) const { return Path(this, Kind::kIndex, i, {}); }
  // The key of the i-th dict entry.
  Path key(int64_t i) const { return Path(this, Kind::kKey, i, {}); }
  // The value of the i-th dict entry, named by its key when that is a string
  // or an int.
  Path value(int64_t i, const pb::Value& key) const {
    if (key.kind_case() == pb::Value::kStringValue) {
      return Path(this, Kind::kStringKey, i, key.string_value());
    }
    if (key.kind_case() == pb::Value::kIntValue) {
      return Path(this, Kind::kIndex, key.int_value(), {});
    }
    return Path(this, Kind::kValue, i, {});
  }
  Path value(int64_t i, const c10::IValue& key) const {
    if (key.isString()) {
      return Path(this, Kind::kStringKey, i, key.toStringRef());
    }
    if (key.isInt()) return Path(this, Kind::kIndex, key.toInt(), {});
    return Path(this, Kind::kValue, i, {});
  }

  std::string str() const {
    std::string out = parent_ == nullptr ? "" : parent_->str();
    switch (kind_) {
      case Kind::kRoot:
        absl::StrAppend(&out, "root");
        break;
      case Kind::kIndex:
        absl::StrAppend(&out, "[", n_, "]");
        break;
      case Kind::kStringKey: {
        constexpr size_t kMaxShown = 32;
        std::string shown = absl::CHexEscape(key_.substr(0, kMaxShown));
        absl::StrAppend(&out, "[\"", shown,
                        key_.size() > kMaxShown ? "...\"]" : "\"]");
        break;
      }
      case Kind::kKey:
        absl::StrAppend(&out, "{key of entry ", n_, "}");
        break;
      case Kind::kValue:
        absl::StrAppend(&out, "{value of entry ", n_, "}");
        break;
    }
    return out;
  }

 private:
  enum class Kind { kRoot, kIndex, kStringKey, kKey, kValue };

  Path(const Path* parent, Kind kind, int64_t n, absl::string_view key)
      : parent_(parent), kind_(kind), n_(n), key_(key) {}

  const Path* parent_;
  Kind kind_;
  int64_t n_;
  // WARNING: a view of the payload or of the IValue being encoded, which
  // outlive every Path.
  absl::string_view key_;
};

// Error-message parts are formatted inside the out-of-line error builders,
// not at the call sites: temporaries there would each take a stack slot in
// the recursive functions (every one of them, under ASan), and deep values
// would then overflow the stack.
struct KindOf {
  const c10::IValue& value;
};

template <typename T,
          typename = std::enable_if_t<!std::is_base_of_v<c10::Type, T>>>
const T& fmt(const T& part) {
  return part;
}
inline std::string fmt(const c10::Type& type) { return type.repr_str(); }
inline std::string fmt(const KindOf& kind) { return kind.value.tagKind(); }
inline std::string fmt(const c10::Device& device) { return device.str(); }
inline std::string fmt(c10::Layout layout) { return c10::str(layout); }
inline std::string fmt(c10::IntArrayRef sizes) { return c10::str(sizes); }

// "<what> at <path>: <details>".
template <typename... Parts>
ABSL_ATTRIBUTE_NOINLINE absl::Status invalid(absl::string_view what,
                                             const Path& path,
                                             const Parts&... parts) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " at ", path.str(), ": ", fmt(parts)...));
}

template <typename... Parts>
ABSL_ATTRIBUTE_NOINLINE absl::Status exhausted(absl::string_view what,
                                               const Path& path,
                                               const Parts&... parts) {
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " at ", path.str(), ": ", fmt(parts)...));
}

// The protobuf parser's recursion budget: enough for kMaxSupportedDepth
// containers of the deepest kind (3 levels each) and a type description as
// deep (1 level each), plus the envelope and leaves.
constexpr int kParseRecursionLimit = 4 * kMaxSupportedDepth + 16;

inline int effective_max_depth(int max_depth) {
  return std::clamp(max_depth, 0, kMaxSupportedDepth);
}

// The one refusal of nesting, by encode and decode alike.
inline absl::Status too_deep(absl::string_view what, const Path& path,
                             int max) {
  return exhausted(what, path, "containers nested deeper than ", max,
                   " (the limit max_depth, RpcOptions::limits)");
}

// The type's reflection is looked up once: through the message (a virtual
// call and a descriptor look-up) it cost about 100 instructions a message.
template <typename M>
inline bool has_unknown_fields(const M& m) {
  static const google::protobuf::Reflection* const reflection =
      M::GetReflection();
  return !reflection->GetUnknownFields(m).empty();
}

// a * b and a + b for non-negative int64, false on overflow.
inline bool mul_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool add_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// A small message's envelope is built in a block on the stack: an arena's
// own first block is a malloc and a free in every encode and decode. Make
// the arena as `Arena arena(block, kArenaBlockBytes)`: that constructor
// keeps the default policy without setting one up (ArenaOptions, even
// with only the block, took twice the instructions to make and to free).
constexpr size_t kArenaBlockBytes = 2048;

// ---- tensors' storages (encoder.cc)

// A tensor a message carries: as it travels (detached, conj and neg bits
// resolved), and the tensor as the caller gave it (repeats of one tensor
// share one compact clone).
struct TensorToShip {
  at::Tensor tensor;
  const c10::TensorImpl* origin;
};
// What travels for a TensorToShip: its storage whole, or a compact clone
// (the rule of codec.h's "Views"), and that storage's index.
struct ShippedTensor {
  at::Tensor tensor;
  int64_t index;
};
// The shipped form of each of `in`, in order; appends the storages they
// travel in to `storages`, each once. LibTorch may throw (a clone).
std::vector<ShippedTensor> ship_tensors(absl::Span<const TensorToShip> in,
                                        std::vector<c10::Storage>& storages);

// ---- plain values (plain_encoder.cc)

// Encodes a value made only of None, bools, ints, floats, strings, tuples,
// strided CPU tensors and dicts of str keys and Any values (keyword
// arguments): what most calls and results are, straight into
// the envelope's bytes: the bytes protobuf's serializer writes for that
// envelope (codec_test holds them equal), without building its messages
// first. False, with `out` untouched, for any other value or one nested
// deeper than `limits` allow: the general encoder then encodes it or says
// what is wrong with it. LibTorch may throw (a clone, a detach).
bool encode_plain(const c10::IValue& value, const ContextMeta* autograd,
                  const Limits& limits, Message& out);

// ---- dense tensors (decoder.cc)

// A defined dense tensor's fields as the wire has them, its dtype known
// and its dims within the limit; views of the envelope's fields.
struct DenseTensor {
  c10::ScalarType dtype;
  absl::Span<const int64_t> sizes;
  absl::Span<const int64_t> strides;
  int64_t storage_offset;
  uint64_t storage_index;
  bool requires_grad;
};
// The tensor over in.storages that `t` describes, every field checked
// against the others and the storage (INVALID_ARGUMENT naming what, at
// `path`).
absl::StatusOr<at::Tensor> dense_tensor(const DenseTensor& t, const Message& in,
                                        const Path& path);

// ---- plain values, read (plain_decoder.cc)

// Decodes an envelope written as encode_plain() writes it (a value of
// encode_plain()'s kinds, its
// fields in protobuf's canonical order and form) straight from its bytes,
// to the value decode() makes of it through protobuf's messages; sets
// `*autograd` (if given) to its context metadata. False for anything else
// or anything wrong (other kinds, fields or orders, a limit, a bad tensor),
// with *out and *autograd untouched: the general decoder then decodes it or
// says what is wrong with it. LibTorch may throw.
bool decode_plain(const Message& in, const Limits& limits, c10::IValue* out,
                  ContextMeta* autograd);

// ---- dtypes and torch enums (dtypes.cc)

// c10's dtype as the wire's, false if it has none (quantized, ...).
bool to_wire_dtype(c10::ScalarType type, pb::DType* out);
bool from_wire_dtype(int wire, c10::ScalarType* out);
// A TorchEnum's wire value (its kind's numbering), -1 if it has none.
int to_wire_enum(const TorchEnum& e);
// The TorchEnum of `kind`'s wire value `wire`, None if unknown.
c10::IValue from_wire_enum(int kind, int wire);

// ---- the types values travel with (types.cc)

bool is_key_kind(c10::TypeKind kind);
bool is_hashable_key(const c10::IValue& v);
bool same_wire_type(const c10::Type& a, const c10::Type& b);
c10::TypePtr list_element_type(const c10::IValue& list);
bool matches(const c10::IValue& v, const c10::Type& type);

}  // namespace tether::wire::codec_internal

#endif  // TETHER_CORE_WIRE_INTERNAL_CODEC_SUPPORT_H_
