// decode(): a Message's envelope and storages into an IValue tree, every
// field checked.
#include "core/wire/internal/codec_support.h"

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
namespace codec_internal {

absl::StatusOr<at::Tensor> dense_tensor(const DenseTensor& t, const Message& in,
                                        const Path& path) {
  constexpr absl::string_view kWhat = "tensor";
  const c10::ScalarType dtype = t.dtype;
  const int64_t dims = static_cast<int64_t>(t.sizes.size());
  if (static_cast<int64_t>(t.strides.size()) != dims) {
    return invalid(kWhat, path, dims, " sizes but ", t.strides.size(),
                   " strides");
  }
  // The element count must fit in int64 (zero-size dims aside) and so must
  // the bytes the elements span.
  int64_t numel_nonzero = 1;
  bool empty = false;
  int64_t last = 0;  // Offset of the last element past the first, if any.
  for (int64_t d = 0; d < dims; ++d) {
    const int64_t size = t.sizes[d];
    const int64_t stride = t.strides[d];
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
  const int64_t offset = t.storage_offset;
  if (offset < 0) {
    return invalid(kWhat, path, "negative storage offset ", offset);
  }
  const uint64_t index = t.storage_index;
  if (index >= in.storages.size()) {
    return invalid(kWhat, path, "storage index ", index, " out of range (",
                   in.storages.size(), " storages)");
  }
  const c10::Storage& storage = in.storages[index];
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
  if (t.requires_grad && !c10::isFloatingType(dtype) &&
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
      c10::IntArrayRef(t.sizes.data(), dims),
      c10::IntArrayRef(t.strides.data(), dims), offset);
  if (t.requires_grad) out.set_requires_grad(true);
  return out;
}

namespace {

// ---------------------------------------------------------------------------
// Decoder

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
  return dense_tensor(
      DenseTensor{dtype, absl::MakeConstSpan(t.sizes().data(), dims),
                  absl::MakeConstSpan(t.strides().data(), t.strides_size()),
                  t.storage_offset(), t.storage_index(), t.requires_grad()},
      in_, path);
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

}  // namespace

}  // namespace codec_internal

using codec_internal::has_unknown_fields;
using codec_internal::kArenaBlockBytes;
using codec_internal::kParseRecursionLimit;
using codec_internal::kWireVersion;
using codec_internal::Path;
namespace pb = ::tether::wire;

namespace {

absl::StatusOr<c10::IValue> decode_message(const Message& in,
                                           const Limits& limits,
                                           ReferenceHook* rrefs,
                                           ContextMeta* autograd,
                                           bool plain_first) {
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
    c10::IValue plain;
    if (plain_first &&
        codec_internal::decode_plain(in, limits, &plain, autograd)) {
      return plain;
    }
    alignas(16) char block[kArenaBlockBytes];
    google::protobuf::Arena arena(block, kArenaBlockBytes);
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
        (envelope->has_autograd() &&
         has_unknown_fields(envelope->autograd()))) {
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
    codec_internal::Decoder decoder(in, limits, rrefs);
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

}  // namespace

absl::StatusOr<c10::IValue> decode(const Message& in, const Limits& limits,
                                   ReferenceHook* rrefs,
                                   ContextMeta* autograd) {
  return decode_message(in, limits, rrefs, autograd, /*plain_first=*/true);
}

namespace internal {

absl::StatusOr<c10::IValue> decode_through_messages(const Message& in,
                                                    const Limits& limits,
                                                    ReferenceHook* rrefs,
                                                    ContextMeta* autograd) {
  return decode_message(in, limits, rrefs, autograd, /*plain_first=*/false);
}

}  // namespace internal

}  // namespace tether::wire
