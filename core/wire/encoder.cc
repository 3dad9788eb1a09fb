// encode(): an IValue tree into a Message's envelope and storages.
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
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/wire/wire.pb.h"

namespace tether::wire {
namespace codec_internal {
namespace {

std::atomic<ObjectEncoder> object_encoder{nullptr};

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

// A map for ship_tensors' look-ups by address, of at most `most` entries: a
// scan of a short vector for a message's few tensors (a hash table's
// allocation and hashing cost more than the scan there), else Abseil's flat
// table, sized once.
template <typename K, typename V>
class AddressMap {
 public:
  explicit AddressMap(size_t most) : hashed_(most > kScanned) {
    if (hashed_) table_.reserve(most);
  }
  // The value of `key`, or nullptr.
  const V* find(K key) const {
    if (hashed_) {
      auto it = table_.find(key);
      return it == table_.end() ? nullptr : &it->second;
    }
    for (const auto& [k, v] : scanned_) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  // Adds `key` (absent) with `value`; returns the stored value.
  const V& add(K key, V value) {
    if (hashed_) return table_.emplace(key, std::move(value)).first->second;
    scanned_.emplace_back(key, std::move(value));
    return scanned_.back().second;
  }

 private:
  static constexpr size_t kScanned = 8;
  const bool hashed_;
  absl::InlinedVector<std::pair<K, V>, kScanned> scanned_;
  absl::flat_hash_map<K, V> table_;
};

}  // namespace

std::vector<ShippedTensor> ship_tensors(absl::Span<const TensorToShip> in,
                                        std::vector<c10::Storage>& storages) {
  // Whether each storage travels whole, once the whole tree is known: views
  // of a storage that travels whole anyway share it instead of being cloned.
  AddressMap<const c10::StorageImpl*, bool> whole(in.size());
  for (const TensorToShip& t : in) {
    if (!ships_storage_whole(t.tensor)) continue;
    const c10::StorageImpl* storage = t.tensor.storage().unsafeGetStorageImpl();
    if (whole.find(storage) == nullptr) whole.add(storage, true);
  }
  AddressMap<const c10::StorageImpl*, int64_t> index_of(in.size());
  AddressMap<const c10::TensorImpl*, at::Tensor> clones(in.size());
  std::vector<ShippedTensor> out;
  out.reserve(in.size());
  storages.reserve(storages.size() + in.size());
  for (const TensorToShip& t : in) {
    at::Tensor shipped = t.tensor;
    if (t.tensor.numel() == 0 ||
        whole.find(t.tensor.storage().unsafeGetStorageImpl()) == nullptr) {
      const at::Tensor* clone = clones.find(t.origin);
      if (clone == nullptr) {
        clone = &clones.add(
            t.origin, t.tensor.numel() == 0
                          ? at::empty(t.tensor.sizes(), t.tensor.options())
                          : t.tensor.clone(at::MemoryFormat::Contiguous));
      }
      shipped = *clone;
    }
    const c10::StorageImpl* storage = shipped.storage().unsafeGetStorageImpl();
    const int64_t* known = index_of.find(storage);
    int64_t index = 0;
    if (known != nullptr) {
      index = *known;
    } else {
      index = static_cast<int64_t>(storages.size());
      index_of.add(storage, index);
      storages.push_back(shipped.storage());
    }
    out.push_back({std::move(shipped), index});
  }
  return out;
}

namespace {

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
  // The tensors to ship and, at the same index, their descriptions.
  std::vector<TensorToShip> pending_;
  std::vector<pb::Tensor*> descs_;
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
  pending_.push_back({std::move(plain), t.unsafeGetTensorImpl()});
  descs_.push_back(out);
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

void Encoder::assign_storages() {
  std::vector<ShippedTensor> shipped = ship_tensors(pending_, storages_);
  for (size_t i = 0; i < shipped.size(); ++i) {
    const at::Tensor& t = shipped[i].tensor;
    pb::Tensor* desc = descs_[i];
    for (int64_t d = 0; d < t.dim(); ++d) {
      desc->add_sizes(t.size(d));
      desc->add_strides(t.stride(d));
    }
    desc->set_storage_offset(t.storage_offset());
    desc->set_storage_index(static_cast<uint64_t>(shipped[i].index));
  }
}

}  // namespace

}  // namespace codec_internal

using codec_internal::kArenaBlockBytes;
using codec_internal::kWireVersion;
using codec_internal::object_encoder;
using codec_internal::Path;
namespace pb = ::tether::wire;

void set_object_encoder(ObjectEncoder encoder) {
  object_encoder.store(encoder, std::memory_order_release);
}

namespace {

absl::Status encode_value(const c10::IValue& value, Message& out,
                          ReferenceHook* rrefs, const ContextMeta* autograd,
                          const Limits& limits, bool plain_first) {
  try {
    if (plain_first &&
        codec_internal::encode_plain(value, autograd, limits, out)) {
      return absl::OkStatus();
    }
    alignas(16) char block[kArenaBlockBytes];
    google::protobuf::Arena arena(block, kArenaBlockBytes);
    auto* envelope =
        google::protobuf::Arena::CreateMessage<pb::Envelope>(&arena);
    codec_internal::Encoder encoder(rrefs, limits);
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
    // Written with the sizes ByteSizeLong() has just cached: the same
    // bytes as SerializeToString(), which would compute them again.
    std::string payload(size, '\0');
    uint8_t* end = envelope->SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(payload.data()));
    if (end != reinterpret_cast<uint8_t*>(payload.data()) + size) {
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

}  // namespace

absl::Status encode(const c10::IValue& value, Message& out,
                    ReferenceHook* rrefs, const ContextMeta* autograd,
                    const Limits& limits) {
  return encode_value(value, out, rrefs, autograd, limits,
                      /*plain_first=*/true);
}

namespace internal {

absl::Status encode_through_messages(const c10::IValue& value, Message& out,
                                     ReferenceHook* rrefs,
                                     const ContextMeta* autograd,
                                     const Limits& limits) {
  return encode_value(value, out, rrefs, autograd, limits,
                      /*plain_first=*/false);
}

}  // namespace internal

}  // namespace tether::wire
