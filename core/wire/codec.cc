#include "core/wire/codec.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <ATen/ops/_validate_sparse_coo_tensor_args.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/wire/wire.pb.h"

namespace tether::wire {
namespace {

// The generated messages share this namespace; pb:: marks them.
namespace pb = ::tether::wire;

// Bumped when an older decoder would misread what a newer encoder writes.
constexpr uint32_t kWireVersion = 1;

std::atomic<ObjectEncoder> object_encoder{nullptr};

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
std::string fmt(const c10::Type& type) { return type.repr_str(); }
std::string fmt(const KindOf& kind) { return kind.value.tagKind(); }
std::string fmt(const c10::Device& device) { return device.str(); }
std::string fmt(c10::Layout layout) { return c10::str(layout); }
std::string fmt(c10::IntArrayRef sizes) { return c10::str(sizes); }

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

int effective_max_depth(int max_depth) {
  return std::clamp(max_depth, 0, kMaxSupportedDepth);
}

// The one refusal of nesting, by encode and decode alike.
absl::Status too_deep(absl::string_view what, const Path& path, int max) {
  return exhausted(what, path, "containers nested deeper than ", max,
                   " (the limit max_depth, RpcOptions::limits)");
}

// ---------------------------------------------------------------------------
// dtypes

bool to_wire_dtype(c10::ScalarType type, pb::DType* out) {
  switch (type) {
    case c10::ScalarType::Byte:
      *out = pb::DTYPE_UINT8;
      return true;
    case c10::ScalarType::Char:
      *out = pb::DTYPE_INT8;
      return true;
    case c10::ScalarType::Short:
      *out = pb::DTYPE_INT16;
      return true;
    case c10::ScalarType::Int:
      *out = pb::DTYPE_INT32;
      return true;
    case c10::ScalarType::Long:
      *out = pb::DTYPE_INT64;
      return true;
    case c10::ScalarType::Half:
      *out = pb::DTYPE_FLOAT16;
      return true;
    case c10::ScalarType::Float:
      *out = pb::DTYPE_FLOAT32;
      return true;
    case c10::ScalarType::Double:
      *out = pb::DTYPE_FLOAT64;
      return true;
    case c10::ScalarType::ComplexHalf:
      *out = pb::DTYPE_COMPLEX32;
      return true;
    case c10::ScalarType::ComplexFloat:
      *out = pb::DTYPE_COMPLEX64;
      return true;
    case c10::ScalarType::ComplexDouble:
      *out = pb::DTYPE_COMPLEX128;
      return true;
    case c10::ScalarType::Bool:
      *out = pb::DTYPE_BOOL;
      return true;
    case c10::ScalarType::BFloat16:
      *out = pb::DTYPE_BFLOAT16;
      return true;
    default:
      return false;
  }
}

// `wire` is an int, not the enum: proto3 enums are open.
bool from_wire_dtype(int wire, c10::ScalarType* out) {
  switch (wire) {
    case pb::DTYPE_UINT8:
      *out = c10::ScalarType::Byte;
      return true;
    case pb::DTYPE_INT8:
      *out = c10::ScalarType::Char;
      return true;
    case pb::DTYPE_INT16:
      *out = c10::ScalarType::Short;
      return true;
    case pb::DTYPE_INT32:
      *out = c10::ScalarType::Int;
      return true;
    case pb::DTYPE_INT64:
      *out = c10::ScalarType::Long;
      return true;
    case pb::DTYPE_FLOAT16:
      *out = c10::ScalarType::Half;
      return true;
    case pb::DTYPE_FLOAT32:
      *out = c10::ScalarType::Float;
      return true;
    case pb::DTYPE_FLOAT64:
      *out = c10::ScalarType::Double;
      return true;
    case pb::DTYPE_COMPLEX32:
      *out = c10::ScalarType::ComplexHalf;
      return true;
    case pb::DTYPE_COMPLEX64:
      *out = c10::ScalarType::ComplexFloat;
      return true;
    case pb::DTYPE_COMPLEX128:
      *out = c10::ScalarType::ComplexDouble;
      return true;
    case pb::DTYPE_BOOL:
      *out = c10::ScalarType::Bool;
      return true;
    case pb::DTYPE_BFLOAT16:
      *out = c10::ScalarType::BFloat16;
      return true;
    default:
      return false;
  }
}

// Layouts and memory formats, c10's and the wire's.
constexpr std::pair<c10::Layout, pb::Layout> kLayouts[] = {
    {c10::Layout::Strided, pb::LAYOUT_STRIDED},
    {c10::Layout::Sparse, pb::LAYOUT_SPARSE_COO},
    {c10::Layout::SparseCsr, pb::LAYOUT_SPARSE_CSR},
    {c10::Layout::SparseCsc, pb::LAYOUT_SPARSE_CSC},
    {c10::Layout::SparseBsr, pb::LAYOUT_SPARSE_BSR},
    {c10::Layout::SparseBsc, pb::LAYOUT_SPARSE_BSC},
    {c10::Layout::Mkldnn, pb::LAYOUT_MKLDNN},
};
constexpr std::pair<c10::MemoryFormat, pb::MemoryFormat> kMemoryFormats[] = {
    {c10::MemoryFormat::Contiguous, pb::MEMORY_FORMAT_CONTIGUOUS},
    {c10::MemoryFormat::Preserve, pb::MEMORY_FORMAT_PRESERVE},
    {c10::MemoryFormat::ChannelsLast, pb::MEMORY_FORMAT_CHANNELS_LAST},
    {c10::MemoryFormat::ChannelsLast3d, pb::MEMORY_FORMAT_CHANNELS_LAST_3D},
};

// The wire number of c10 enum value `value` in `table`, 0 if none.
template <typename C10, typename Wire, size_t N>
int wire_of(const std::pair<C10, Wire> (&table)[N], int64_t value) {
  for (const auto& [c10_value, wire] : table) {
    if (static_cast<int64_t>(c10_value) == value) return wire;
  }
  return 0;
}

// The c10 enum value (as an int) of wire number `wire` in `table`, -1 if
// none.
template <typename C10, typename Wire, size_t N>
int64_t c10_of(const std::pair<C10, Wire> (&table)[N], int wire) {
  for (const auto& [c10_value, w] : table) {
    if (w == wire) return static_cast<int64_t>(c10_value);
  }
  return -1;
}

// The wire number of `e`'s value, 0 if it has none.
int to_wire_enum(const TorchEnum& e) {
  switch (e.kind) {
    case TorchEnum::Kind::kDtype: {
      pb::DType dtype;
      const bool known =
          e.value >= 0 &&
          e.value < static_cast<int64_t>(c10::ScalarType::NumOptions) &&
          to_wire_dtype(static_cast<c10::ScalarType>(e.value), &dtype);
      return known ? dtype : 0;
    }
    case TorchEnum::Kind::kLayout:
      return wire_of(kLayouts, e.value);
    case TorchEnum::Kind::kMemoryFormat:
      return wire_of(kMemoryFormats, e.value);
  }
  return 0;
}

// The TorchEnum of a wire kind and number, or a null IValue if unknown.
c10::IValue from_wire_enum(int kind, int wire) {
  using Kind = TorchEnum::Kind;
  switch (kind) {
    case pb::EnumValue::KIND_DTYPE: {
      c10::ScalarType dtype;
      if (!from_wire_dtype(wire, &dtype)) return c10::IValue();
      return TorchEnum::make(Kind::kDtype, static_cast<int64_t>(dtype));
    }
    case pb::EnumValue::KIND_LAYOUT: {
      const int64_t layout = c10_of(kLayouts, wire);
      if (layout < 0) return c10::IValue();
      return TorchEnum::make(Kind::kLayout, layout);
    }
    case pb::EnumValue::KIND_MEMORY_FORMAT: {
      const int64_t format = c10_of(kMemoryFormats, wire);
      if (format < 0) return c10::IValue();
      return TorchEnum::make(Kind::kMemoryFormat, format);
    }
    default:
      return c10::IValue();
  }
}

// ---------------------------------------------------------------------------
// Types

// Dict key types c10 can hash (c10::detail::DictKeyHash) and DictType::create
// accepts.
bool is_key_kind(c10::TypeKind kind) {
  switch (kind) {
    case c10::TypeKind::AnyType:
    case c10::TypeKind::IntType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::ComplexType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::TensorType:
    case c10::TypeKind::DeviceObjType:
      return true;
    default:
      return false;
  }
}

bool is_hashable_key(const c10::IValue& v) {
  return v.isInt() || v.isString() || v.isDouble() || v.isComplexDouble() ||
         v.isBool() || v.isTensor() || v.isDevice();
}

// Whether a and b describe the same wire type: what the TypeDesc keeps
// (kinds and structure, not tensor shapes or NamedTuple names).
bool same_wire_type(const c10::Type& a, const c10::Type& b) {
  if (a.kind() != b.kind()) return false;
  auto a_contained = a.containedTypes();
  auto b_contained = b.containedTypes();
  if (a_contained.size() != b_contained.size()) return false;
  for (size_t i = 0; i < a_contained.size(); ++i) {
    if (!same_wire_type(*a_contained[i], *b_contained[i])) return false;
  }
  return true;
}

c10::TypePtr list_element_type(const c10::IValue& list) {
  return list.toList().elementType();
}

// Whether `v` may sit where a value of `type` is expected. Containers carry
// their own types; those must be the same wire type as the expected ones
// (c10 lists and dicts are invariant).
bool matches(const c10::IValue& v, const c10::Type& type) {
  switch (type.kind()) {
    case c10::TypeKind::AnyType:
      return true;
    case c10::TypeKind::NoneType:
      return v.isNone();
    case c10::TypeKind::BoolType:
      return v.isBool();
    case c10::TypeKind::IntType:
      return v.isInt();
    case c10::TypeKind::FloatType:
      return v.isDouble();
    case c10::TypeKind::ComplexType:
      return v.isComplexDouble();
    case c10::TypeKind::StringType:
      return v.isString();
    case c10::TypeKind::DeviceObjType:
      return v.isDevice();
    case c10::TypeKind::TensorType:
      return v.isTensor();
    case c10::TypeKind::RRefType:
      return v.isRRef();
    case c10::TypeKind::OptionalType:
      return v.isNone() ||
             matches(v, *type.expectRef<c10::OptionalType>().getElementType());
    case c10::TypeKind::ListType:
      return v.isList() &&
             same_wire_type(*list_element_type(v),
                            *type.expectRef<c10::ListType>().getElementType());
    case c10::TypeKind::DictType: {
      if (!v.isGenericDict()) return false;
      const auto& dict_type = type.expectRef<c10::DictType>();
      auto dict = v.toGenericDict();
      return same_wire_type(*dict.keyType(), *dict_type.getKeyType()) &&
             same_wire_type(*dict.valueType(), *dict_type.getValueType());
    }
    case c10::TypeKind::TupleType: {
      if (!v.isTuple()) return false;
      const auto& elems = v.toTupleRef().elements();
      auto types = type.expectRef<c10::TupleType>().elements();
      if (elems.size() != types.size()) return false;
      for (size_t i = 0; i < elems.size(); ++i) {
        if (!matches(elems[i], *types[i])) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------
// Encoder

class Encoder {
 public:
  Encoder(ReferenceHook* rrefs, const Limits& limits)
      : rrefs_(rrefs), max_depth_(effective_max_depth(limits.max_depth)) {}

  absl::Status value(const c10::IValue& v, pb::Value* out, const Path& path,
                     int depth);
  // Picks each tensor's storage (whole or a compact clone) once the whole
  // tree is known, so that views of a storage that travels whole anyway
  // share it instead of being cloned.
  void assign_storages();

  std::vector<c10::Storage>& storages() { return storages_; }

 private:
  struct PendingTensor {
    pb::Tensor* desc;
    // Detached, conj and neg bits resolved.
    at::Tensor tensor;
    // The tensor as the caller gave it, to clone each one at most once.
    const c10::TensorImpl* origin;
  };

  // Out of line, like the other non-recursive steps below: their locals
  // would otherwise enlarge every frame of the recursion.
  ABSL_ATTRIBUTE_NOINLINE absl::Status type(const c10::Type& t,
                                            pb::TypeDesc* out, const Path& path,
                                            absl::string_view role, int depth);
  ABSL_ATTRIBUTE_NOINLINE absl::Status tensor(const at::Tensor& t,
                                              pb::Tensor* out,
                                              const Path& path);
  ABSL_ATTRIBUTE_NOINLINE absl::Status sparse_coo(const at::Tensor& t,
                                                  pb::Tensor* out,
                                                  const Path& path);
  ABSL_ATTRIBUTE_NOINLINE absl::Status list(const c10::IValue& v, pb::List* out,
                                            const Path& path, int depth);
  ABSL_ATTRIBUTE_NOINLINE absl::Status dict(const c10::IValue& v, pb::Dict* out,
                                            const Path& path, int depth);

  ABSL_ATTRIBUTE_NOINLINE absl::Status rref(const c10::IValue& v,
                                            pb::RRef* out, const Path& path);
  // `depth`: containers enclosing the pickled object, whose lifted objects
  // sit one deeper.
  ABSL_ATTRIBUTE_NOINLINE absl::Status pickled(const Pickled& p,
                                               pb::PickledObject* out,
                                               const Path& path, int depth);

  ReferenceHook* const rrefs_;
  const int max_depth_;
  std::vector<PendingTensor> pending_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> materialized_;
  std::vector<c10::Storage> storages_;
  // The indices and values of the sparse tensors encoded so far.
  std::vector<at::Tensor> sparse_parts_;
};

absl::Status Encoder::value(const c10::IValue& v, pb::Value* out,
                            const Path& path, int depth) {
  if (v.isNone()) {
    out->mutable_none();
  } else if (v.isBool()) {
    out->set_bool_value(v.toBool());
  } else if (v.isInt()) {
    out->set_int_value(v.toInt());
  } else if (v.isDouble()) {
    out->set_double_value(v.toDouble());
  } else if (v.isComplexDouble()) {
    c10::complex<double> c = v.toComplexDouble();
    out->mutable_complex_value()->set_real(c.real());
    out->mutable_complex_value()->set_imag(c.imag());
  } else if (v.isString()) {
    out->set_string_value(v.toStringRef());
  } else if (v.isDevice()) {
    c10::Device device = v.toDevice();
    if (!device.is_cpu()) {
      return invalid("device", path, "unsupported device ", device,
                     " (only cpu devices travel)");
    }
    out->mutable_device()->set_kind(pb::DEVICE_KIND_CPU);
    out->mutable_device()->set_index(device.index());
  } else if (v.isTensor()) {
    return tensor(v.toTensor(), out->mutable_tensor(), path);
  } else if (v.isRRef()) {
    return rref(v, out->mutable_rref(), path);
  } else if (v.isList() || v.isTuple() || v.isGenericDict()) {
    // Also what stops a list that contains itself.
    if (depth + 1 > max_depth_) return too_deep("value", path, max_depth_);
    if (v.isList()) return list(v, out->mutable_list(), path, depth + 1);
    if (v.isGenericDict()) return dict(v, out->mutable_dict(), path, depth + 1);
    const auto& elems = v.toTupleRef().elements();
    pb::Tuple* tuple = out->mutable_tuple();
    for (size_t i = 0; i < elems.size(); ++i) {
      absl::Status s =
          value(elems[i], tuple->add_elems(), path.index(i), depth + 1);
      if (!s.ok()) return s;
    }
  } else if (const TorchEnum* e = TorchEnum::of(v)) {
    const int wire = to_wire_enum(*e);
    if (wire == 0) {
      const bool dtype =
          e->kind == TorchEnum::Kind::kDtype && e->value >= 0 &&
          e->value < static_cast<int64_t>(c10::ScalarType::NumOptions);
      return invalid(
          "torch enum", path, "unsupported value ",
          dtype ? c10::toString(static_cast<c10::ScalarType>(e->value))
                : std::to_string(e->value),
          e->kind == TorchEnum::Kind::kDtype    ? " (a dtype)"
          : e->kind == TorchEnum::Kind::kLayout ? " (a layout)"
                                                : " (a memory format)");
    }
    out->mutable_torch_enum()->set_kind(
        e->kind == TorchEnum::Kind::kDtype ? pb::EnumValue::KIND_DTYPE
        : e->kind == TorchEnum::Kind::kLayout
            ? pb::EnumValue::KIND_LAYOUT
            : pb::EnumValue::KIND_MEMORY_FORMAT);
    out->mutable_torch_enum()->set_value(wire);
  } else if (const FunctionRef* ref = FunctionRef::of(v)) {
    if (ref->name.empty()) {
      return invalid("function reference", path, "empty name");
    }
    out->mutable_function_ref()->set_name(ref->name);
  } else if (const Pickled* pickled = Pickled::of(v)) {
    return this->pickled(*pickled, out->mutable_pickled(), path, depth);
  } else if (v.isPyObject()) {
    // A front end's object, which travels as that front end pickles it.
    ObjectEncoder encoder = object_encoder.load(std::memory_order_acquire);
    if (encoder == nullptr) {
      return invalid("value", path,
                     "a Python object, and no front end in this process "
                     "encodes Python objects");
    }
    absl::StatusOr<c10::IValue> encoded = encoder(v);
    if (!encoded.ok()) {
      return invalid("value", path, encoded.status().message());
    }
    const Pickled* as_pickled = Pickled::of(*encoded);
    if (as_pickled == nullptr) {
      return absl::InternalError(
          "the front end's object encoder returned no pickled value");
    }
    return this->pickled(*as_pickled, out->mutable_pickled(), path, depth);
  } else {
    return invalid("value", path, "unsupported IValue kind ", KindOf{v});
  }
  return absl::OkStatus();
}

absl::Status Encoder::pickled(const Pickled& p, pb::PickledObject* out,
                              const Path& path, int depth) {
  if (depth + 1 > max_depth_) return too_deep("pickled", path, max_depth_);
  out->set_data(p.data);
  for (size_t i = 0; i < p.objects.size(); ++i) {
    absl::Status s =
        value(p.objects[i], out->add_objects(), path.index(i), depth + 1);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Encoder::type(const c10::Type& t, pb::TypeDesc* out,
                           const Path& path, absl::string_view role,
                           int depth) {
  if (depth > max_depth_) return too_deep(role, path, max_depth_);
  using K = pb::TypeDesc;
  switch (t.kind()) {
    case c10::TypeKind::AnyType:
      out->set_kind(K::KIND_ANY);
      return absl::OkStatus();
    case c10::TypeKind::NoneType:
      out->set_kind(K::KIND_NONE);
      return absl::OkStatus();
    case c10::TypeKind::BoolType:
      out->set_kind(K::KIND_BOOL);
      return absl::OkStatus();
    case c10::TypeKind::IntType:
      out->set_kind(K::KIND_INT);
      return absl::OkStatus();
    case c10::TypeKind::FloatType:
      out->set_kind(K::KIND_FLOAT);
      return absl::OkStatus();
    case c10::TypeKind::ComplexType:
      out->set_kind(K::KIND_COMPLEX);
      return absl::OkStatus();
    case c10::TypeKind::StringType:
      out->set_kind(K::KIND_STRING);
      return absl::OkStatus();
    case c10::TypeKind::DeviceObjType:
      out->set_kind(K::KIND_DEVICE);
      return absl::OkStatus();
    case c10::TypeKind::TensorType:
      out->set_kind(K::KIND_TENSOR);
      return absl::OkStatus();
    case c10::TypeKind::ListType:
      out->set_kind(K::KIND_LIST);
      break;
    case c10::TypeKind::TupleType:
      out->set_kind(K::KIND_TUPLE);
      break;
    case c10::TypeKind::DictType:
      out->set_kind(K::KIND_DICT);
      break;
    case c10::TypeKind::OptionalType:
      out->set_kind(K::KIND_OPTIONAL);
      break;
    case c10::TypeKind::RRefType:
      out->set_kind(K::KIND_RREF);
      break;
    default:
      return invalid(role, path, "unsupported type ", t);
  }
  for (const c10::TypePtr& contained : t.containedTypes()) {
    absl::Status s =
        type(*contained, out->add_contained(), path, role, depth + 1);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Encoder::rref(const c10::IValue& v, pb::RRef* out,
                           const Path& path) {
  if (rrefs_ == nullptr) {
    return invalid("rref", path, "an RRef can only be sent by a worker");
  }
  absl::StatusOr<RRefForkData> data = rrefs_->fork(v.toRRef());
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat("rref at ", path.str(), ": ",
                                     data.status().message()));
  }
  out->set_owner(data->owner);
  out->set_rref_worker(data->rref_worker);
  out->set_rref_local(data->rref_local);
  out->set_fork_worker(data->fork_worker);
  out->set_fork_local(data->fork_local);
  out->set_parent(data->parent);
  return type(*data->type, out->mutable_type(), path, "rref type", 1);
}

absl::Status Encoder::list(const c10::IValue& v, pb::List* out,
                           const Path& path, int depth) {
  c10::impl::GenericList list = v.toList();
  const c10::TypePtr& elem_type = list.elementType();
  absl::Status s =
      type(*elem_type, out->mutable_elem_type(), path, "list element type", 1);
  if (!s.ok()) return s;
  for (size_t i = 0; i < list.size(); ++i) {
    c10::IValue elem = list.get(i);
    if (!matches(elem, *elem_type)) {
      return invalid("list", path, "a list of ", *elem_type, " holds a ",
                     KindOf{elem}, " at index ", i);
    }
    switch (elem_type->kind()) {
      case c10::TypeKind::IntType:
        out->add_ints(elem.toInt());
        break;
      case c10::TypeKind::FloatType:
        out->add_doubles(elem.toDouble());
        break;
      case c10::TypeKind::BoolType:
        out->add_bools(elem.toBool());
        break;
      default:
        s = value(elem, out->add_elems(), path.index(i), depth);
        if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Encoder::dict(const c10::IValue& v, pb::Dict* out,
                           const Path& path, int depth) {
  c10::impl::GenericDict dict = v.toGenericDict();
  absl::Status s =
      type(*dict.keyType(), out->mutable_key_type(), path, "dict key type", 1);
  if (!s.ok()) return s;
  s = type(*dict.valueType(), out->mutable_value_type(), path,
           "dict value type", 1);
  if (!s.ok()) return s;
  int64_t i = 0;
  for (const auto& entry : dict) {
    pb::DictEntry* e = out->add_entries();
    s = value(entry.key(), e->mutable_key(), path.key(i), depth);
    if (!s.ok()) return s;
    s = value(entry.value(), e->mutable_value(), path.value(i, entry.key()),
              depth);
    if (!s.ok()) return s;
    ++i;
  }
  return absl::OkStatus();
}

// A tensor's wire dtype, if it is on the cpu and its dtype travels.
absl::Status cpu_dtype(const at::Tensor& t, const Path& path,
                       pb::DType* dtype) {
  if (!t.device().is_cpu()) {
    return invalid("tensor", path, "unsupported tensor on device ", t.device(),
                   " (only cpu tensors travel)");
  }
  if (!to_wire_dtype(t.scalar_type(), dtype)) {
    return invalid("tensor", path, "unsupported dtype ",
                   c10::toString(t.scalar_type()));
  }
  return absl::OkStatus();
}

absl::Status Encoder::tensor(const at::Tensor& t, pb::Tensor* out,
                             const Path& path) {
  if (!t.defined()) return absl::OkStatus();  // An empty Tensor message.
  if (t.is_quantized()) {
    return invalid("tensor", path, "unsupported quantized tensor");
  }
  if (t.layout() == c10::kSparse) return sparse_coo(t, out, path);
  if (t.layout() != c10::kStrided || t.is_nested()) {
    if (t.is_nested()) {
      return invalid("tensor", path, "unsupported nested tensor");
    }
    return invalid("tensor", path, "unsupported ", t.layout(),
                   " tensor (only strided tensors travel)");
  }
  pb::DType dtype;
  absl::Status travels = cpu_dtype(t, path, &dtype);
  if (!travels.ok()) return travels;
  // Detached only if it has a history to drop: detach() goes through the
  // dispatcher and makes a tensor (about 3,400 instructions, a third of
  // encoding a small call), and a tensor without grad has no history.
  at::Tensor plain = t.requires_grad() ? t.detach() : t;
  if (plain._is_zerotensor() || plain.is_conj() || plain.is_neg()) {
    // A conj or neg view shares its base's storage but not its values, and a
    // zero tensor has no storage: each travels materialized, once per tensor
    // so that repeats of it still alias each other.
    auto it = materialized_.find(t.unsafeGetTensorImpl());
    if (it == materialized_.end()) {
      at::Tensor values = plain._is_zerotensor()
                              ? at::zeros(plain.sizes(), plain.options())
                              : plain.resolve_conj().resolve_neg();
      it = materialized_.emplace(t.unsafeGetTensorImpl(), std::move(values))
               .first;
    }
    plain = it->second;
  }
  if (!plain.has_storage()) {
    return invalid("tensor", path,
                   "unsupported tensor without storage (a wrapper tensor?)");
  }
  out->set_defined(true);
  out->set_dtype(dtype);
  out->set_requires_grad(t.requires_grad());
  pending_.push_back({out, std::move(plain), t.unsafeGetTensorImpl()});
  return absl::OkStatus();
}

absl::Status Encoder::sparse_coo(const at::Tensor& t, pb::Tensor* out,
                                 const Path& path) {
  pb::DType dtype;
  absl::Status travels = cpu_dtype(t, path, &dtype);
  if (!travels.ok()) return travels;
  out->set_defined(true);
  out->set_dtype(dtype);
  out->set_requires_grad(t.requires_grad());
  for (int64_t d = 0; d < t.dim(); ++d) out->add_sizes(t.size(d));
  pb::SparseCoo* parts = out->mutable_sparse_coo();
  parts->set_coalesced(t.is_coalesced());
  // The parts of the detached tensor: plain dense tensors, no grad. Kept
  // alive until encode ends: pending_ and the clone maps key tensors by
  // address, which a freed part's successor could reuse.
  at::Tensor plain = t.detach();
  sparse_parts_.push_back(plain._indices());
  sparse_parts_.push_back(plain._values());
  const size_t n = sparse_parts_.size();
  absl::Status s =
      tensor(sparse_parts_[n - 2], parts->mutable_indices(), path);
  if (!s.ok()) return s;
  return tensor(sparse_parts_[n - 1], parts->mutable_values(), path);
}

// The rule of the header ("Views"), the peer's own (its RPC utils'
// worthRecopying): a view is compacted only when its storage is at least
// kCompactFromBytes and at least kCompactFromWaste times the view's bytes.
constexpr int64_t kCompactFromBytes = 8 * 1024;
constexpr int64_t kCompactFromWaste = 2;

bool ships_storage_whole(const at::Tensor& t) {
  if (t.numel() == 0) return false;
  const int64_t storage = static_cast<int64_t>(t.storage().nbytes());
  const int64_t useful = t.numel() * static_cast<int64_t>(t.element_size());
  return storage < kCompactFromBytes || storage < kCompactFromWaste * useful;
}

void Encoder::assign_storages() {
  std::unordered_set<const c10::StorageImpl*> whole;
  for (const PendingTensor& p : pending_) {
    if (ships_storage_whole(p.tensor)) {
      whole.insert(p.tensor.storage().unsafeGetStorageImpl());
    }
  }
  std::unordered_map<const c10::StorageImpl*, int64_t> index_of;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> clones;
  for (PendingTensor& p : pending_) {
    at::Tensor shipped = p.tensor;
    if (p.tensor.numel() == 0 ||
        whole.count(p.tensor.storage().unsafeGetStorageImpl()) == 0) {
      auto it = clones.find(p.origin);
      if (it == clones.end()) {
        at::Tensor compact =
            p.tensor.numel() == 0
                ? at::empty(p.tensor.sizes(), p.tensor.options())
                : p.tensor.clone(at::MemoryFormat::Contiguous);
        it = clones.emplace(p.origin, std::move(compact)).first;
      }
      shipped = it->second;
    }
    const c10::Storage& storage = shipped.storage();
    auto [it, added] = index_of.emplace(storage.unsafeGetStorageImpl(),
                                        static_cast<int64_t>(storages_.size()));
    if (added) storages_.push_back(storage);
    for (int64_t d = 0; d < shipped.dim(); ++d) {
      p.desc->add_sizes(shipped.size(d));
      p.desc->add_strides(shipped.stride(d));
    }
    p.desc->set_storage_offset(shipped.storage_offset());
    p.desc->set_storage_index(static_cast<uint64_t>(it->second));
  }
}

// ---------------------------------------------------------------------------
// Decoder

// The type's reflection is looked up once: through the message (a virtual
// call and a descriptor look-up) it cost about 100 instructions a message.
template <typename M>
bool has_unknown_fields(const M& m) {
  static const google::protobuf::Reflection* const reflection =
      M::GetReflection();
  return !reflection->GetUnknownFields(m).empty();
}

// a * b and a + b for non-negative int64, false on overflow.
bool mul_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
bool add_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

class Decoder {
 public:
  Decoder(const Message& in, const Limits& limits, ReferenceHook* rrefs)
      : in_(in),
        rrefs_(rrefs),
        limits_(limits),
        max_depth_(effective_max_depth(limits.max_depth)) {}

  // `depth`: containers enclosing `v`.
  absl::StatusOr<c10::IValue> value(const pb::Value& v, const Path& path,
                                    int depth);

 private:
  absl::Status count(const Path& path, int64_t n);
  // Out of line, like tensor and device: their locals would otherwise
  // enlarge every frame of the recursion.
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<c10::TypePtr> type(
      const pb::TypeDesc& t, const Path& path, absl::string_view role,
      int depth);
  // Out of line so that a level of nesting costs one container's frame,
  // not the sum of all three.
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<c10::IValue> list(const pb::List& l,
                                                           const Path& path,
                                                           int depth);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<c10::IValue> tuple(const pb::Tuple& t,
                                                            const Path& path,
                                                            int depth);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<c10::IValue> dict(const pb::Dict& d,
                                                           const Path& path,
                                                           int depth);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<c10::IValue> rref(const pb::RRef& r,
                                                           const Path& path);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<c10::IValue> pickled(
      const pb::PickledObject& p, const Path& path, int depth);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<at::Tensor> tensor(const pb::Tensor& t,
                                                            const Path& path);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<at::Tensor> sparse_coo(
      const pb::Tensor& t, c10::ScalarType dtype, const Path& path);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<c10::Device> device(
      const pb::Device& d, const Path& path);

  const Message& in_;
  ReferenceHook* const rrefs_;
  const Limits& limits_;
  const int max_depth_;
  int64_t values_ = 0;
};

absl::Status Decoder::count(const Path& path, int64_t n) {
  values_ += n;  // n is a repeated field's size: no overflow.
  if (values_ > limits_.max_values) {
    return exhausted("value", path, "more than ", limits_.max_values,
                     " values in the message");
  }
  return absl::OkStatus();
}

absl::StatusOr<c10::IValue> Decoder::value(const pb::Value& v, const Path& path,
                                           int depth) {
  absl::Status s = count(path, 1);
  if (!s.ok()) return s;
  if (has_unknown_fields(v)) {
    return invalid("value", path,
                   "unknown fields (a kind from a newer version?)");
  }
  switch (v.kind_case()) {
    case pb::Value::kNone:
      if (has_unknown_fields(v.none())) {
        return invalid("none", path, "unknown fields");
      }
      return c10::IValue();
    case pb::Value::kBoolValue:
      return c10::IValue(v.bool_value());
    case pb::Value::kIntValue:
      return c10::IValue(static_cast<int64_t>(v.int_value()));
    case pb::Value::kDoubleValue:
      return c10::IValue(v.double_value());
    case pb::Value::kComplexValue:
      if (has_unknown_fields(v.complex_value())) {
        return invalid("complex", path, "unknown fields");
      }
      return c10::IValue(c10::complex<double>(v.complex_value().real(),
                                              v.complex_value().imag()));
    case pb::Value::kStringValue:
      return c10::IValue(v.string_value());
    case pb::Value::kDevice: {
      absl::StatusOr<c10::Device> device_or = device(v.device(), path);
      if (!device_or.ok()) return device_or.status();
      return c10::IValue(*device_or);
    }
    case pb::Value::kTensor: {
      absl::StatusOr<at::Tensor> tensor_or = tensor(v.tensor(), path);
      if (!tensor_or.ok()) return tensor_or.status();
      return c10::IValue(*std::move(tensor_or));
    }
    case pb::Value::kRref:
      return rref(v.rref(), path);
    case pb::Value::kFunctionRef:
      if (has_unknown_fields(v.function_ref())) {
        return invalid("function reference", path, "unknown fields");
      }
      if (v.function_ref().name().empty()) {
        return invalid("function reference", path, "empty name");
      }
      return FunctionRef::make(v.function_ref().name());
    case pb::Value::kTorchEnum: {
      const pb::EnumValue& e = v.torch_enum();
      if (has_unknown_fields(e)) {
        return invalid("torch enum", path, "unknown fields");
      }
      c10::IValue out = from_wire_enum(e.kind(), e.value());
      if (out.isNone()) {
        return invalid("torch enum", path, "unknown value ", e.value(),
                       " of kind ", static_cast<int>(e.kind()));
      }
      return out;
    }
    case pb::Value::kPickled:
      if (depth + 1 > max_depth_) return too_deep("pickled", path, max_depth_);
      return pickled(v.pickled(), path, depth + 1);
    case pb::Value::kList:
    case pb::Value::kTuple:
    case pb::Value::kDict:
      if (depth + 1 > max_depth_) return too_deep("value", path, max_depth_);
      if (v.kind_case() == pb::Value::kList) {
        return list(v.list(), path, depth + 1);
      }
      if (v.kind_case() == pb::Value::kTuple) {
        return tuple(v.tuple(), path, depth + 1);
      }
      return dict(v.dict(), path, depth + 1);
    case pb::Value::KIND_NOT_SET:
      break;
  }
  return invalid("value", path, "no kind set");
}

absl::StatusOr<c10::IValue> Decoder::pickled(const pb::PickledObject& p,
                                             const Path& path, int depth) {
  if (has_unknown_fields(p)) return invalid("pickled", path, "unknown fields");
  absl::Status s = count(path, p.objects_size());
  if (!s.ok()) return s;
  std::vector<c10::IValue> objects;
  objects.reserve(p.objects_size());
  for (int i = 0; i < p.objects_size(); ++i) {
    absl::StatusOr<c10::IValue> object =
        value(p.objects(i), path.index(i), depth);
    if (!object.ok()) return object.status();
    objects.push_back(*std::move(object));
  }
  return Pickled::make(p.data(), std::move(objects));
}

absl::StatusOr<c10::TypePtr> Decoder::type(const pb::TypeDesc& t,
                                           const Path& path,
                                           absl::string_view role, int depth) {
  absl::Status s = count(path, 1);
  if (!s.ok()) return s;
  if (has_unknown_fields(t)) return invalid(role, path, "unknown fields");
  using K = pb::TypeDesc;
  const int kind = t.kind();  // Open enum: any int.
  size_t arity = 0;           // Contained types expected; SIZE_MAX: any.
  switch (kind) {
    case K::KIND_ANY:
    case K::KIND_NONE:
    case K::KIND_BOOL:
    case K::KIND_INT:
    case K::KIND_FLOAT:
    case K::KIND_COMPLEX:
    case K::KIND_STRING:
    case K::KIND_DEVICE:
    case K::KIND_TENSOR:
      arity = 0;
      break;
    case K::KIND_LIST:
    case K::KIND_OPTIONAL:
    case K::KIND_RREF:
      arity = 1;
      break;
    case K::KIND_DICT:
      arity = 2;
      break;
    case K::KIND_TUPLE:
      arity = SIZE_MAX;
      break;
    default:
      return invalid(role, path, "unknown type kind ", kind);
  }
  const auto& contained_desc = t.contained();
  if (arity != SIZE_MAX &&
      static_cast<size_t>(contained_desc.size()) != arity) {
    return invalid(role, path, K::Kind_Name(t.kind()), " takes ", arity,
                   " contained types, not ", contained_desc.size());
  }
  std::vector<c10::TypePtr> contained;
  if (!contained_desc.empty()) {
    if (depth + 1 > max_depth_) return too_deep(role, path, max_depth_);
    contained.reserve(contained_desc.size());
    for (const pb::TypeDesc& c : contained_desc) {
      absl::StatusOr<c10::TypePtr> c_or = type(c, path, role, depth + 1);
      if (!c_or.ok()) return c_or.status();
      contained.push_back(*std::move(c_or));
    }
  }
  switch (kind) {
    case K::KIND_ANY:
      return c10::AnyType::get();
    case K::KIND_NONE:
      return c10::NoneType::get();
    case K::KIND_BOOL:
      return c10::BoolType::get();
    case K::KIND_INT:
      return c10::IntType::get();
    case K::KIND_FLOAT:
      return c10::FloatType::get();
    case K::KIND_COMPLEX:
      return c10::ComplexType::get();
    case K::KIND_STRING:
      return c10::StringType::get();
    case K::KIND_DEVICE:
      return c10::DeviceObjType::get();
    case K::KIND_TENSOR:
      return c10::TensorType::get();
    case K::KIND_LIST:
      return c10::ListType::create(contained[0]);
    case K::KIND_RREF:
      return c10::RRefType::create(contained[0]);
    case K::KIND_TUPLE:
      return c10::TupleType::create(std::move(contained));
    case K::KIND_DICT:
      if (!is_key_kind(contained[0]->kind())) {
        return invalid(role, path, "unsupported dict key type ", *contained[0]);
      }
      return c10::DictType::create(contained[0], contained[1]);
    case K::KIND_OPTIONAL:
      if (contained[0]->kind() == c10::TypeKind::NoneType) {
        return invalid(role, path, "Optional[None] is not a type");
      }
      if (contained[0]->kind() == c10::TypeKind::TensorType) {
        // The very pointer IValue::isOptionalTensorList compares with.
        return c10::getTypePtr<c10::optional<at::Tensor>>();
      }
      return c10::OptionalType::create(contained[0]);
  }
  return invalid(role, path, "unknown type kind ", kind);  // Unreachable.
}

absl::StatusOr<c10::IValue> Decoder::rref(const pb::RRef& r,
                                          const Path& path) {
  if (has_unknown_fields(r)) return invalid("rref", path, "unknown fields");
  if (rrefs_ == nullptr) {
    return invalid("rref", path, "an RRef can only be received by a worker");
  }
  if (!r.has_type()) return invalid("rref", path, "no value type");
  absl::StatusOr<c10::TypePtr> type_or = type(r.type(), path, "rref type", 1);
  if (!type_or.ok()) return type_or.status();
  RRefForkData data;
  data.owner = r.owner();
  data.rref_worker = r.rref_worker();
  data.rref_local = r.rref_local();
  data.fork_worker = r.fork_worker();
  data.fork_local = r.fork_local();
  data.parent = r.parent();
  data.type = *std::move(type_or);
  absl::StatusOr<c10::intrusive_ptr<c10::RRefInterface>> local =
      rrefs_->adopt(data);
  if (!local.ok()) {
    return absl::Status(local.status().code(),
                        absl::StrCat("rref at ", path.str(), ": ",
                                     local.status().message()));
  }
  return c10::IValue(*std::move(local));
}

absl::StatusOr<c10::IValue> Decoder::list(const pb::List& l, const Path& path,
                                          int depth) {
  if (has_unknown_fields(l)) return invalid("list", path, "unknown fields");
  if (!l.has_elem_type()) {
    return invalid("list", path, "no element type");
  }
  absl::StatusOr<c10::TypePtr> elem_type_or =
      type(l.elem_type(), path, "list element type", 1);
  if (!elem_type_or.ok()) return elem_type_or.status();
  const c10::TypePtr& elem_type = *elem_type_or;
  const c10::TypeKind kind = elem_type->kind();
  const bool packed_ints = kind == c10::TypeKind::IntType;
  const bool packed_doubles = kind == c10::TypeKind::FloatType;
  const bool packed_bools = kind == c10::TypeKind::BoolType;
  const bool packed = packed_ints || packed_doubles || packed_bools;
  if ((!packed_ints && l.ints_size() > 0) ||
      (!packed_doubles && l.doubles_size() > 0) ||
      (!packed_bools && l.bools_size() > 0) || (packed && l.elems_size() > 0)) {
    return invalid("list", path,
                   "elements stored in the wrong field for a "
                   "list of ",
                   *elem_type);
  }
  c10::impl::GenericList out(elem_type);
  if (packed) {
    int64_t n = packed_ints      ? l.ints_size()
                : packed_doubles ? l.doubles_size()
                                 : l.bools_size();
    absl::Status s = count(path, n);
    if (!s.ok()) return s;
    out.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      if (packed_ints) {
        out.push_back(c10::IValue(static_cast<int64_t>(l.ints(i))));
      } else if (packed_doubles) {
        out.push_back(c10::IValue(l.doubles(i)));
      } else {
        out.push_back(c10::IValue(l.bools(i)));
      }
    }
    return c10::IValue(std::move(out));
  }
  out.reserve(l.elems_size());
  for (int i = 0; i < l.elems_size(); ++i) {
    Path elem_path = path.index(i);
    absl::StatusOr<c10::IValue> elem_or = value(l.elems(i), elem_path, depth);
    if (!elem_or.ok()) return elem_or.status();
    if (!matches(*elem_or, *elem_type)) {
      return invalid("value", elem_path, "a ", KindOf{*elem_or},
                     " in a list of ", *elem_type);
    }
    out.push_back(*std::move(elem_or));
  }
  return c10::IValue(std::move(out));
}

absl::StatusOr<c10::IValue> Decoder::tuple(const pb::Tuple& t, const Path& path,
                                           int depth) {
  if (has_unknown_fields(t)) return invalid("tuple", path, "unknown fields");
  std::vector<c10::IValue> elems;
  elems.reserve(t.elems_size());
  for (int i = 0; i < t.elems_size(); ++i) {
    absl::StatusOr<c10::IValue> elem_or =
        value(t.elems(i), path.index(i), depth);
    if (!elem_or.ok()) return elem_or.status();
    elems.push_back(*std::move(elem_or));
  }
  return c10::IValue(c10::ivalue::Tuple::create(std::move(elems)));
}

absl::StatusOr<c10::IValue> Decoder::dict(const pb::Dict& d, const Path& path,
                                          int depth) {
  if (has_unknown_fields(d)) return invalid("dict", path, "unknown fields");
  if (!d.has_key_type() || !d.has_value_type()) {
    return invalid("dict", path, "no key or value type");
  }
  absl::StatusOr<c10::TypePtr> key_type_or =
      type(d.key_type(), path, "dict key type", 1);
  if (!key_type_or.ok()) return key_type_or.status();
  absl::StatusOr<c10::TypePtr> value_type_or =
      type(d.value_type(), path, "dict value type", 1);
  if (!value_type_or.ok()) return value_type_or.status();
  const c10::TypePtr& key_type = *key_type_or;
  const c10::TypePtr& value_type = *value_type_or;
  if (!is_key_kind(key_type->kind())) {
    return invalid("dict", path, "unsupported key type ", *key_type);
  }
  c10::impl::GenericDict out(key_type, value_type);
  out.reserve(d.entries_size());
  for (int i = 0; i < d.entries_size(); ++i) {
    const pb::DictEntry& entry = d.entries(i);
    Path key_path = path.key(i);
    if (has_unknown_fields(entry)) {
      return invalid("dict entry", key_path, "unknown fields");
    }
    if (!entry.has_key() || !entry.has_value()) {
      return invalid("dict entry", key_path, "no key or no value");
    }
    absl::StatusOr<c10::IValue> key_or = value(entry.key(), key_path, depth);
    if (!key_or.ok()) return key_or.status();
    if (!matches(*key_or, *key_type) || !is_hashable_key(*key_or)) {
      return invalid("dict key", key_path, "a ", KindOf{*key_or},
                     " in a dict keyed by ", *key_type);
    }
    Path value_path = path.value(i, entry.key());
    absl::StatusOr<c10::IValue> value_or =
        value(entry.value(), value_path, depth);
    if (!value_or.ok()) return value_or.status();
    if (!matches(*value_or, *value_type)) {
      return invalid("dict value", value_path, "a ", KindOf{*value_or},
                     " in a dict of ", *value_type, " values");
    }
    if (!out.insert(*std::move(key_or), *std::move(value_or)).second) {
      return invalid("dict key", key_path, "duplicate key");
    }
  }
  return c10::IValue(std::move(out));
}

absl::StatusOr<c10::Device> Decoder::device(const pb::Device& d,
                                            const Path& path) {
  if (has_unknown_fields(d)) return invalid("device", path, "unknown fields");
  if (d.kind() != pb::DEVICE_KIND_CPU) {
    return invalid("device", path, "unsupported device kind ",
                   static_cast<int>(d.kind()));
  }
  if (d.index() != -1 && d.index() != 0) {
    return invalid("device", path, "cpu device index ", d.index(),
                   " (must be -1 or 0)");
  }
  return c10::Device(c10::kCPU, static_cast<c10::DeviceIndex>(d.index()));
}

absl::StatusOr<at::Tensor> Decoder::tensor(const pb::Tensor& t,
                                           const Path& path) {
  constexpr absl::string_view kWhat = "tensor";
  if (has_unknown_fields(t)) return invalid(kWhat, path, "unknown fields");
  if (!t.defined()) {
    if (t.dtype() != 0 || t.sizes_size() != 0 || t.strides_size() != 0 ||
        t.storage_offset() != 0 || t.requires_grad() ||
        t.storage_index() != 0 || t.has_sparse_coo()) {
      return invalid(kWhat, path, "undefined tensor with metadata");
    }
    return at::Tensor();
  }
  c10::ScalarType dtype;
  if (!from_wire_dtype(t.dtype(), &dtype)) {
    return invalid(kWhat, path, "unknown dtype ", static_cast<int>(t.dtype()));
  }
  const int64_t dims = t.sizes_size();
  if (dims > limits_.max_tensor_dims) {
    return exhausted(kWhat, path, dims, " dims, more than the limit of ",
                     limits_.max_tensor_dims);
  }
  if (t.has_sparse_coo()) return sparse_coo(t, dtype, path);
  if (t.strides_size() != dims) {
    return invalid(kWhat, path, dims, " sizes but ", t.strides_size(),
                   " strides");
  }
  // The element count must fit in int64 (zero-size dims aside) and so must
  // the bytes the elements span.
  int64_t numel_nonzero = 1;
  bool empty = false;
  int64_t last = 0;  // Offset of the last element past the first, if any.
  for (int64_t d = 0; d < dims; ++d) {
    const int64_t size = t.sizes(d);
    const int64_t stride = t.strides(d);
    if (size < 0) {
      return invalid(kWhat, path, "negative size ", size, " in dim ", d);
    }
    if (stride < 0) {
      return invalid(kWhat, path, "negative stride ", stride, " in dim ", d);
    }
    if (size == 0) {
      empty = true;
      continue;
    }
    int64_t step;
    if (!mul_ok(numel_nonzero, size, &numel_nonzero) ||
        !mul_ok(size - 1, stride, &step) || !add_ok(last, step, &last)) {
      return invalid(kWhat, path, "sizes and strides overflow int64");
    }
  }
  const int64_t offset = t.storage_offset();
  if (offset < 0) {
    return invalid(kWhat, path, "negative storage offset ", offset);
  }
  const uint64_t index = t.storage_index();
  if (index >= in_.storages.size()) {
    return invalid(kWhat, path, "storage index ", index, " out of range (",
                   in_.storages.size(), " storages)");
  }
  const c10::Storage& storage = in_.storages[index];
  if (!storage) {
    return invalid(kWhat, path, "storage ", index, " is null");
  }
  if (storage.device_type() != c10::kCPU) {
    return invalid(kWhat, path, "storage ", index, " is on ", storage.device(),
                   ", not cpu");
  }
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t end = offset;  // In elements, one past the last one.
  if (!empty && (!add_ok(end, last, &end) || !add_ok(end, 1, &end))) {
    return invalid(kWhat, path, "storage offset overflows int64");
  }
  int64_t needed;
  if (!mul_ok(end, itemsize, &needed)) {
    return invalid(kWhat, path, "storage span overflows int64");
  }
  const int64_t available = static_cast<int64_t>(storage.nbytes());
  if (needed > available) {
    return invalid(kWhat, path, "needs ", needed, " bytes of storage ", index,
                   " (offset ", offset, ", ", c10::toString(dtype),
                   "), which holds ", available);
  }
  if (t.requires_grad() && !c10::isFloatingType(dtype) &&
      !c10::isComplexType(dtype)) {
    return invalid(kWhat, path, "requires_grad on a ", c10::toString(dtype),
                   " tensor");
  }
  // A dense CPU tensor over the storage, made as at::from_blob makes one:
  // through the dispatcher (at::empty, then set_) it cost about 4,000
  // instructions, a third of decoding a small call.
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(dtype));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(
      c10::IntArrayRef(t.sizes().data(), dims),
      c10::IntArrayRef(t.strides().data(), dims), offset);
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

absl::StatusOr<at::Tensor> Decoder::sparse_coo(const pb::Tensor& t,
                                               c10::ScalarType dtype,
                                               const Path& path) {
  constexpr absl::string_view kWhat = "sparse tensor";
  const pb::SparseCoo& parts = t.sparse_coo();
  if (has_unknown_fields(parts)) return invalid(kWhat, path, "unknown fields");
  if (t.strides_size() != 0 || t.storage_offset() != 0 ||
      t.storage_index() != 0) {
    return invalid(kWhat, path, "strides, storage offset or storage index set");
  }
  if (!parts.has_indices() || !parts.has_values()) {
    return invalid(kWhat, path, "no indices or no values");
  }
  // Checked before decoding them: the parts are dense, never sparse again.
  if (parts.indices().has_sparse_coo() || parts.values().has_sparse_coo()) {
    return invalid(kWhat, path, "indices or values are sparse themselves");
  }
  absl::StatusOr<at::Tensor> indices_or = tensor(parts.indices(), path);
  if (!indices_or.ok()) return indices_or.status();
  absl::StatusOr<at::Tensor> values_or = tensor(parts.values(), path);
  if (!values_or.ok()) return values_or.status();
  const at::Tensor& indices = *indices_or;
  const at::Tensor& values = *values_or;
  if (!indices.defined() || !values.defined()) {
    return invalid(kWhat, path, "undefined indices or values");
  }
  if (indices.requires_grad() || values.requires_grad()) {
    return invalid(kWhat, path, "indices or values require grad themselves");
  }
  if (indices.scalar_type() != c10::ScalarType::Long || indices.dim() != 2) {
    return invalid(kWhat, path, "indices must be a 2-dim int64 tensor, not ",
                   indices.dim(), "-dim ",
                   c10::toString(indices.scalar_type()));
  }
  if (values.scalar_type() != dtype) {
    return invalid(kWhat, path, "values are ",
                   c10::toString(values.scalar_type()), ", the tensor is ",
                   c10::toString(dtype));
  }
  const int64_t dims = t.sizes_size();
  const int64_t sparse_dim = indices.size(0);
  const int64_t nnz = indices.size(1);
  const int64_t dense_dim = values.dim() - 1;
  if (dense_dim < 0 || values.size(0) != nnz) {
    return invalid(kWhat, path, nnz, " indices but values of shape ",
                   values.sizes());
  }
  if (sparse_dim + dense_dim != dims) {
    return invalid(kWhat, path, sparse_dim, " sparse and ", dense_dim,
                   " dense dims for a ", dims, "-dim tensor");
  }
  int64_t numel = 1;
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  for (int64_t d = 0; d < dims; ++d) {
    if (sizes[d] < 0) {
      return invalid(kWhat, path, "negative size ", sizes[d], " in dim ", d);
    }
    if (sizes[d] != 0 && !mul_ok(numel, sizes[d], &numel)) {
      return invalid(kWhat, path, "sizes overflow int64");
    }
    if (d >= sparse_dim && values.size(1 + d - sparse_dim) != sizes[d]) {
      return invalid(kWhat, path, "values of shape ", values.sizes(),
                     " for dense dim ", d, " of size ", sizes[d]);
    }
  }
  // Every index within its dim, and sorted and unique if said coalesced:
  // LibTorch's kernels trust both.
  const auto idx = indices.accessor<int64_t, 2>();
  for (int64_t i = 0; i < nnz; ++i) {
    int order = i == 0 ? 1 : 0;  // Of element i against i - 1 (lexicographic).
    for (int64_t d = 0; d < sparse_dim; ++d) {
      const int64_t v = idx[d][i];
      if (v < 0 || v >= sizes[d]) {
        return invalid(kWhat, path, "index ", v, " of element ", i,
                       " out of range for dim ", d, " of size ", sizes[d]);
      }
      if (order == 0 && v != idx[d][i - 1]) order = v > idx[d][i - 1] ? 1 : -1;
    }
    if (parts.coalesced() && order != 1) {
      return invalid(kWhat, path, "said coalesced but element ", i,
                     " is not after element ", i - 1);
    }
  }
  if (t.requires_grad() && !c10::isFloatingType(dtype) &&
      !c10::isComplexType(dtype)) {
    return invalid(kWhat, path, "requires_grad on a ", c10::toString(dtype),
                   " tensor");
  }
  const at::TensorOptions options =
      at::TensorOptions().dtype(dtype).layout(c10::kSparse);
  at::_validate_sparse_coo_tensor_args(indices, values, sizes);
  at::Tensor out =
      at::_sparse_coo_tensor_unsafe(indices, values, sizes, options);
  out._coalesced_(parts.coalesced());
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

// A small message's envelope is built in a block on the stack: an arena's
// own first block is a malloc and a free in every encode and decode.
constexpr size_t kArenaBlockBytes = 2048;

google::protobuf::ArenaOptions arena_on(char* block) {
  google::protobuf::ArenaOptions options;
  options.initial_block = block;
  options.initial_block_size = kArenaBlockBytes;
  return options;
}

}  // namespace

void set_object_encoder(ObjectEncoder encoder) {
  object_encoder.store(encoder, std::memory_order_release);
}

absl::Status encode(const c10::IValue& value, Message& out, ReferenceHook* rrefs,
                    const ContextMeta* autograd, const Limits& limits) {
  try {
    alignas(16) char block[kArenaBlockBytes];
    google::protobuf::Arena arena(arena_on(block));
    auto* envelope =
        google::protobuf::Arena::CreateMessage<pb::Envelope>(&arena);
    Encoder encoder(rrefs, limits);
    absl::Status s =
        encoder.value(value, envelope->mutable_root(), Path::root(), 0);
    if (!s.ok()) return s;
    encoder.assign_storages();
    envelope->set_version(kWireVersion);
    envelope->set_storage_count(encoder.storages().size());
    if (autograd != nullptr && autograd->in_context()) {
      pb::Autograd* meta = envelope->mutable_autograd();
      meta->set_context_id(autograd->context_id);
      meta->set_message_id(autograd->message_id);
      meta->set_from(autograd->from);
    }
    const size_t size = envelope->ByteSizeLong();
    if (size > static_cast<size_t>(INT_MAX)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("encoded payload of ", size,
                       " bytes is over protobuf's 2 GiB limit"));
    }
    std::string payload;
    if (!envelope->SerializeToString(&payload)) {
      return absl::InternalError("serializing the wire envelope failed");
    }
    out.payload = std::move(payload);
    out.storages = std::move(encoder.storages());
    return absl::OkStatus();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while encoding");
  } catch (const std::exception& e) {
    // LibTorch refused something (a clone, a conj resolution): our bug.
    return absl::InternalError(absl::StrCat("encoding failed: ", e.what()));
  }
}

absl::StatusOr<c10::IValue> decode(const Message& in, const Limits& limits,
                                   ReferenceHook* rrefs, ContextMeta* autograd) {
  const int64_t payload_size = static_cast<int64_t>(in.payload.size());
  if (payload_size > limits.max_payload_bytes || payload_size > INT_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "payload of ", payload_size, " bytes is over the limit of ",
        std::min<int64_t>(limits.max_payload_bytes, INT_MAX)));
  }
  if (static_cast<int64_t>(in.storages.size()) > limits.max_storages) {
    return absl::ResourceExhaustedError(
        absl::StrCat(in.storages.size(), " storages, over the limit of ",
                     limits.max_storages));
  }
  try {
    alignas(16) char block[kArenaBlockBytes];
    google::protobuf::Arena arena(arena_on(block));
    auto* envelope =
        google::protobuf::Arena::CreateMessage<pb::Envelope>(&arena);
    google::protobuf::io::CodedInputStream stream(
        reinterpret_cast<const uint8_t*>(in.payload.data()),
        static_cast<int>(payload_size));
    // Value -> Dict -> DictEntry -> Value is 3 protobuf levels per
    // container, plus the deepest type description and a few leaves. The
    // budget is that of the deepest value any encoder makes, not of this
    // receiver's max_depth: a value deeper than max_depth parses and is
    // refused below as RESOURCE_EXHAUSTED naming the limit, as the sender
    // itself would have refused it (a budget from max_depth made it
    // INVALID_ARGUMENT "not a wire envelope" from about 2 * max_depth on).
    stream.SetRecursionLimit(kParseRecursionLimit);
    if (!envelope->ParseFromCodedStream(&stream) ||
        !stream.ConsumedEntireMessage()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload is not a wire envelope (truncated, corrupt, or nested "
          "deeper than any encoder makes: ",
          kMaxSupportedDepth, " containers)"));
    }
    if (has_unknown_fields(*envelope) ||
        (envelope->has_autograd() && has_unknown_fields(envelope->autograd()))) {
      return absl::InvalidArgumentError(
          "envelope has unknown fields (from a newer version?)");
    }
    if (envelope->version() != kWireVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported wire version ", envelope->version(),
                       " (this build speaks ", kWireVersion, ")"));
    }
    if (envelope->storage_count() != in.storages.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "envelope announces ", envelope->storage_count(),
          " storages but the message carries ", in.storages.size()));
    }
    if (!envelope->has_root()) {
      return absl::InvalidArgumentError("envelope has no root value");
    }
    ContextMeta meta;
    if (envelope->has_autograd()) {
      const pb::Autograd& a = envelope->autograd();
      if (a.context_id() < 0 || a.message_id() < -1 || a.from() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed autograd metadata: context ", a.context_id(),
            ", message ", a.message_id(), ", from worker ", a.from()));
      }
      meta.context_id = a.context_id();
      meta.message_id = a.message_id();
      meta.from = a.from();
    }
    Decoder decoder(in, limits, rrefs);
    absl::StatusOr<c10::IValue> value =
        decoder.value(envelope->root(), Path::root(), 0);
    if (value.ok() && autograd != nullptr) *autograd = meta;
    return value;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while decoding");
  } catch (const std::exception& e) {
    // The checks above should leave LibTorch nothing to refuse; if it does,
    // the input was still bad, not our state.
    return absl::InvalidArgumentError(
        absl::StrCat("payload rejected by LibTorch: ", e.what()));
  }
}

namespace {

// Parses a wrapper's payload into `m` (on `arena`): INVALID_ARGUMENT
// naming `what` if it is no such message, has unknown fields or another
// version; RESOURCE_EXHAUSTED over the payload limit.
template <typename M>
absl::Status parse_wrapper(const std::string& payload, const char* what,
                           const Limits& limits, M& m) {
  const int64_t size = static_cast<int64_t>(payload.size());
  if (size > limits.max_payload_bytes || size > INT_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " payload of ", size, " bytes is over the limit of ",
        std::min<int64_t>(limits.max_payload_bytes, INT_MAX)));
  }
  if (!m.ParseFromString(payload)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", what, ": not its wire form"));
  }
  if (has_unknown_fields(m)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed ", what, ": unknown fields (from a newer version?)"));
  }
  if (m.version() != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", what, ": unsupported wire version ",
                     m.version(), " (this build speaks ", kWireVersion, ")"));
  }
  if (m.type() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed ", what, ": it wraps a message of type ", m.type()));
  }
  return absl::OkStatus();
}

// The wrapper's payload serialized, with `inner`'s id and storages.
template <typename M>
absl::StatusOr<Message> wrapped(const M& m, MessageType type, Message inner) {
  if (m.ByteSizeLong() > static_cast<size_t>(INT_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        message_type_name(type), " of ", m.ByteSizeLong(),
        " bytes is over protobuf's 2 GiB limit"));
  }
  Message out;
  out.type = type;
  out.id = inner.id;
  if (!m.SerializeToString(&out.payload)) {
    return absl::InternalError(
        absl::StrCat("serializing a ", message_type_name(type), " failed"));
  }
  out.storages = std::move(inner.storages);
  return out;
}

// The message a parsed wrapper `m` of `in` wraps: `in`'s id and storages.
template <typename M>
Message inner_message(M& m, Message in) {
  Message out;
  out.type = static_cast<MessageType>(m.type());
  out.id = in.id;
  out.payload = std::move(*m.mutable_payload());
  out.storages = std::move(in.storages);
  return out;
}

}  // namespace

absl::StatusOr<Message> wrap_profiled_request(Message inner,
                                              const ProfilerSettings& settings) {
  pb::ProfiledRequestPayload m;
  m.set_version(kWireVersion);
  m.set_type(static_cast<int32_t>(inner.type));
  m.set_payload(std::move(inner.payload));
  m.set_record_shapes(settings.record_shapes);
  m.set_profile_memory(settings.profile_memory);
  m.set_with_stack(settings.with_stack);
  m.set_with_flops(settings.with_flops);
  m.set_with_modules(settings.with_modules);
  return wrapped(m, MessageType::kProfiledRequest, std::move(inner));
}

absl::StatusOr<Message> unwrap_profiled_request(Message in,
                                                ProfilerSettings& settings,
                                                const Limits& limits) {
  pb::ProfiledRequestPayload m;
  if (absl::Status s = parse_wrapper(in.payload, "PROFILED_REQUEST", limits, m);
      !s.ok()) {
    return s;
  }
  settings.record_shapes = m.record_shapes();
  settings.profile_memory = m.profile_memory();
  settings.with_stack = m.with_stack();
  settings.with_flops = m.with_flops();
  settings.with_modules = m.with_modules();
  return inner_message(m, std::move(in));
}

absl::StatusOr<Message> wrap_profiled_response(
    Message inner, const std::vector<ProfiledEvent>& events) {
  pb::ProfiledResponsePayload m;
  m.set_version(kWireVersion);
  m.set_type(static_cast<int32_t>(inner.type));
  m.set_payload(std::move(inner.payload));
  m.mutable_events()->Reserve(static_cast<int>(events.size()));
  for (const ProfiledEvent& e : events) {
    pb::ProfilerEvent* out = m.add_events();
    out->set_kind(static_cast<uint32_t>(e.kind));
    out->set_name(e.name);
    out->set_thread_id(e.thread_id);
    out->set_handle(e.handle);
    for (const std::vector<int64_t>& shape : e.shapes) {
      out->add_shapes()->mutable_sizes()->Add(shape.begin(), shape.end());
    }
    out->set_node_id(e.node_id);
    out->set_cpu_memory_usage(e.cpu_memory_usage);
    out->set_cpu_ns(e.cpu_ns);
  }
  return wrapped(m, MessageType::kProfiledResponse, std::move(inner));
}

absl::StatusOr<Message> unwrap_profiled_response(
    Message in, std::vector<ProfiledEvent>& events, const Limits& limits) {
  pb::ProfiledResponsePayload m;
  if (absl::Status s =
          parse_wrapper(in.payload, "PROFILED_RESPONSE", limits, m);
      !s.ok()) {
    return s;
  }
  events.clear();
  events.reserve(m.events_size());
  for (int i = 0; i < m.events_size(); ++i) {
    const pb::ProfilerEvent& e = m.events(i);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed PROFILED_RESPONSE: event ", i, " ", why));
    };
    if (has_unknown_fields(e)) return bad("has unknown fields");
    if (e.kind() > kMaxProfiledEventKind) {
      return bad(absl::StrCat("has the unknown kind ", e.kind()));
    }
    if (e.cpu_ns() <= 0) {
      return bad(absl::StrCat("has the time ", e.cpu_ns(), " ns"));
    }
    if (e.node_id() < -1) {
      return bad(absl::StrCat("names the worker ", e.node_id()));
    }
    ProfiledEvent out;
    out.kind = static_cast<int>(e.kind());
    out.name = e.name();
    out.thread_id = e.thread_id();
    out.handle = e.handle();
    out.shapes.reserve(e.shapes_size());
    for (const pb::EventShape& shape : e.shapes()) {
      if (has_unknown_fields(shape)) return bad("has a shape of unknown form");
      if (shape.sizes_size() > limits.max_tensor_dims) {
        return bad(absl::StrCat("has a shape of ", shape.sizes_size(),
                                " dimensions, over the limit max_tensor_dims "
                                "of ", limits.max_tensor_dims));
      }
      out.shapes.emplace_back(shape.sizes().begin(), shape.sizes().end());
    }
    out.node_id = e.node_id();
    out.cpu_memory_usage = e.cpu_memory_usage();
    out.cpu_ns = e.cpu_ns();
    events.push_back(std::move(out));
  }
  return inner_message(m, std::move(in));
}

}  // namespace tether::wire
