// encode_plain(): a value of the common kinds straight into the envelope's
// bytes (internal/codec_support.h).
//
// Protobuf's encoder builds the envelope's messages on an arena, sizes them
// and serializes them: about 7,000 instructions for a small call's
// (name, (tensor, float), None), two thirds of them in the messages. This
// writer sizes the value in one walk and writes it in a second, in
// protobuf's own encoding (https://protobuf.dev/programming-guides/encoding/)
// of wire.proto's fields: each field in number order, proto3's zero scalars
// left out, a oneof's member written even when zero, repeated int64 packed.
// Only what wire.proto says of the fields below is assumed; a change there
// that this writer misses shows in codec_test, which holds its bytes equal
// to protobuf's for every kind it writes.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Storage.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "core/wire/internal/codec_support.h"

namespace tether::wire::codec_internal {
namespace {

// Wire types.
constexpr uint8_t kVarint = 0;
constexpr uint8_t kFixed64 = 1;
constexpr uint8_t kLengthDelimited = 2;

// The key of a field numbered below 16: one byte.
constexpr uint8_t key(int field, uint8_t wire_type) {
  return static_cast<uint8_t>(field << 3 | wire_type);
}

// wire.proto's field numbers.
namespace envelope {
constexpr uint8_t kVersion = key(1, kVarint);
constexpr uint8_t kStorageCount = key(2, kVarint);
constexpr uint8_t kContextMeta = key(3, kLengthDelimited);
constexpr uint8_t kRoot = key(15, kLengthDelimited);
}  // namespace envelope
namespace context_meta {
constexpr uint8_t kContextId = key(1, kVarint);
constexpr uint8_t kMessageId = key(2, kVarint);
constexpr uint8_t kFrom = key(3, kVarint);
}  // namespace context_meta
namespace value {
constexpr uint8_t kNone = key(1, kLengthDelimited);
constexpr uint8_t kBool = key(2, kVarint);
constexpr uint8_t kInt = key(3, kVarint);
constexpr uint8_t kDouble = key(4, kFixed64);
constexpr uint8_t kString = key(6, kLengthDelimited);
constexpr uint8_t kTensor = key(8, kLengthDelimited);
constexpr uint8_t kTuple = key(10, kLengthDelimited);
constexpr uint8_t kDict = key(11, kLengthDelimited);
}  // namespace value
namespace tuple {
constexpr uint8_t kElems = key(1, kLengthDelimited);
}  // namespace tuple
namespace dict {
// A dict of str keys and Any values (keyword arguments): its key type and
// value type, TypeDesc{kind: KIND_STRING} and TypeDesc{kind: KIND_ANY},
// whole.
constexpr uint8_t kTypes[] = {key(1, kLengthDelimited), 2, key(1, kVarint), 7,
                              key(2, kLengthDelimited), 2, key(1, kVarint), 1};
constexpr uint8_t kEntries = key(3, kLengthDelimited);
constexpr uint8_t kEntryKey = key(1, kLengthDelimited);
constexpr uint8_t kEntryValue = key(2, kLengthDelimited);
}  // namespace dict
namespace tensor {
constexpr uint8_t kDefined = key(1, kVarint);
constexpr uint8_t kDtype = key(2, kVarint);
constexpr uint8_t kSizes = key(3, kLengthDelimited);
constexpr uint8_t kStrides = key(4, kLengthDelimited);
constexpr uint8_t kStorageOffset = key(5, kVarint);
constexpr uint8_t kRequiresGrad = key(6, kVarint);
constexpr uint8_t kStorageIndex = key(7, kVarint);
}  // namespace tensor

size_t varint_size(uint64_t v) {
  // 1 byte per 7 bits, at least one.
  return static_cast<size_t>((64 - __builtin_clzll(v | 1) + 6) / 7);
}

// Signed fields of int32 and int64 go as their 64-bit two's complement.
uint64_t as_varint(int64_t v) { return static_cast<uint64_t>(v); }

// A length-delimited field of `body` bytes, key included.
size_t field_size(size_t body) { return 1 + varint_size(body) + body; }
// A varint field, key included, or nothing when zero (proto3's scalars).
size_t scalar_size(uint64_t v) { return v == 0 ? 0 : 1 + varint_size(v); }

class Writer {
 public:
  explicit Writer(uint8_t* p) : p_(p) {}
  uint8_t* end() const { return p_; }

  void byte(uint8_t b) { *p_++ = b; }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      *p_++ = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    *p_++ = static_cast<uint8_t>(v);
  }
  void bytes(const void* data, size_t n) {
    std::memcpy(p_, data, n);
    p_ += n;
  }
  void fixed64(uint64_t v) {
    for (int i = 0; i < 8; ++i) *p_++ = static_cast<uint8_t>(v >> (8 * i));
  }
  // The key and length of a length-delimited field.
  void open(uint8_t field_key, size_t body) {
    byte(field_key);
    varint(body);
  }
  void scalar(uint8_t field_key, uint64_t v) {
    if (v == 0) return;
    byte(field_key);
    varint(v);
  }

 private:
  uint8_t* p_;
};

class PlainEncoder {
 public:
  explicit PlainEncoder(const Limits& limits)
      : max_depth_(effective_max_depth(limits.max_depth)) {}

  // First walk: true if `v` is plain; notes each node and the tensors.
  bool scan(const c10::IValue& v, int depth);
  // Then: the shipped form of each tensor (their storages into `storages`),
  // and every node's size; the size of the root's Value message body.
  size_t ship(const c10::IValue& root, std::vector<c10::Storage>& storages);
  // Last walk, in the first's order, from rewind(): writes the Value
  // message's body.
  void rewind() {
    next_node_ = 0;
    next_tensor_ = 0;
  }
  void write(const c10::IValue& v, Writer& w);

 private:
  struct Node {
    // The Value message's body: its one field.
    size_t body = 0;
    // A tuple's, a tensor's or a string's field: the length after its key.
    size_t inner = 0;
  };
  struct TensorFacts {
    int dtype;
    bool requires_grad;
  };

  // The sizes of `v`'s node and those below it, in the first walk's order,
  // once the tensors are shipped; returns the node's body.
  size_t size(const c10::IValue& v);
  // The body of the tensor message of shipped_[i].
  size_t tensor_body(size_t i) const;
  void write_tensor(size_t i, Writer& w) const;

  const int max_depth_;
  // Inline for a call's or a result's few nodes and tensors.
  absl::InlinedVector<Node, 16> nodes_;
  absl::InlinedVector<TensorFacts, 4> facts_;
  absl::InlinedVector<TensorToShip, 4> pending_;
  absl::InlinedVector<ShippedTensor, 4> shipped_;
  // Cursors of the later walks.
  size_t next_node_ = 0;
  size_t next_tensor_ = 0;
};

bool PlainEncoder::scan(const c10::IValue& v, int depth) {
  // The general encoder's order of kinds: an IValue of several kinds goes as
  // the first of them in both.
  nodes_.emplace_back();
  if (v.isNone() || v.isBool() || v.isInt() || v.isDouble()) return true;
  if (v.isComplexDouble()) return false;
  if (v.isString()) return true;
  if (v.isDevice()) return false;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      facts_.push_back({0, false});
      pending_.push_back({at::Tensor(), nullptr});
      return true;
    }
    if (t.is_quantized() || t.layout() != c10::kStrided || t.is_nested() ||
        !t.device().is_cpu()) {
      return false;
    }
    pb::DType dtype;
    if (!to_wire_dtype(t.scalar_type(), &dtype)) return false;
    // As the general encoder: detached only if it has a history to drop.
    at::Tensor plain = t.requires_grad() ? t.detach() : t;
    if (plain._is_zerotensor() || plain.is_conj() || plain.is_neg() ||
        !plain.has_storage()) {
      return false;
    }
    facts_.push_back({static_cast<int>(dtype), t.requires_grad()});
    pending_.push_back({std::move(plain), t.unsafeGetTensorImpl()});
    return true;
  }
  if (v.isTuple()) {
    if (depth + 1 > max_depth_) return false;
    for (const c10::IValue& elem : v.toTupleRef().elements()) {
      if (!scan(elem, depth + 1)) return false;
    }
    return true;
  }
  if (v.isGenericDict()) {
    // Only the shape of keyword arguments: str keys, Any values.
    c10::impl::GenericDict d = v.toGenericDict();
    if (depth + 1 > max_depth_ ||
        d.keyType()->kind() != c10::TypeKind::StringType ||
        d.valueType()->kind() != c10::TypeKind::AnyType) {
      return false;
    }
    for (const auto& entry : d) {
      if (!entry.key().isString() || !scan(entry.key(), depth + 1) ||
          !scan(entry.value(), depth + 1)) {
        return false;
      }
    }
    return true;
  }
  return false;
}

size_t PlainEncoder::ship(const c10::IValue& root,
                          std::vector<c10::Storage>& storages) {
  // Undefined tensors ship nothing: only the defined ones go to
  // ship_tensors, as in the general encoder.
  absl::InlinedVector<TensorToShip, 4> defined;
  for (const TensorToShip& t : pending_) {
    if (t.tensor.defined()) defined.push_back(t);
  }
  std::vector<ShippedTensor> shipped = ship_tensors(defined, storages);
  shipped_.reserve(pending_.size());
  size_t next = 0;
  for (const TensorToShip& t : pending_) {
    shipped_.push_back(t.tensor.defined() ? std::move(shipped[next++])
                                          : ShippedTensor{at::Tensor(), 0});
  }
  rewind();
  return size(root);
}

size_t PlainEncoder::size(const c10::IValue& v) {
  Node& node = nodes_[next_node_++];
  if (v.isNone()) {
    node.body = field_size(0);
  } else if (v.isBool()) {
    node.body = 2;
  } else if (v.isInt()) {
    node.body = 1 + varint_size(as_varint(v.toInt()));
  } else if (v.isDouble()) {
    node.body = 1 + 8;
  } else if (v.isString()) {
    node.inner = v.toStringRef().size();
    node.body = field_size(node.inner);
  } else if (v.isTensor()) {
    node.inner = tensor_body(next_tensor_++);
    node.body = field_size(node.inner);
  } else if (v.isTuple()) {
    node.inner = 0;
    for (const c10::IValue& elem : v.toTupleRef().elements()) {
      node.inner += field_size(size(elem));
    }
    node.body = field_size(node.inner);
  } else {  // a dict of str keys: scan() let nothing else through
    node.inner = sizeof(dict::kTypes);
    for (const auto& entry : v.toGenericDict()) {
      const size_t key = size(entry.key());
      node.inner +=
          field_size(field_size(key) + field_size(size(entry.value())));
    }
    node.body = field_size(node.inner);
  }
  return node.body;
}

size_t PlainEncoder::tensor_body(size_t i) const {
  const TensorFacts& f = facts_[i];
  const at::Tensor& t = shipped_[i].tensor;
  if (!t.defined()) return 0;
  size_t sizes = 0;
  size_t strides = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    sizes += varint_size(as_varint(t.size(d)));
    strides += varint_size(as_varint(t.stride(d)));
  }
  return 2 + scalar_size(static_cast<uint64_t>(f.dtype)) +
         (t.dim() > 0 ? field_size(sizes) + field_size(strides) : 0) +
         scalar_size(as_varint(t.storage_offset())) +
         (f.requires_grad ? 2 : 0) +
         scalar_size(static_cast<uint64_t>(shipped_[i].index));
}

void PlainEncoder::write_tensor(size_t i, Writer& w) const {
  const TensorFacts& f = facts_[i];
  const at::Tensor& t = shipped_[i].tensor;
  if (!t.defined()) return;
  w.byte(tensor::kDefined);
  w.byte(1);
  w.scalar(tensor::kDtype, static_cast<uint64_t>(f.dtype));
  if (t.dim() > 0) {
    size_t sizes = 0;
    size_t strides = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      sizes += varint_size(as_varint(t.size(d)));
      strides += varint_size(as_varint(t.stride(d)));
    }
    w.open(tensor::kSizes, sizes);
    for (int64_t d = 0; d < t.dim(); ++d) w.varint(as_varint(t.size(d)));
    w.open(tensor::kStrides, strides);
    for (int64_t d = 0; d < t.dim(); ++d) w.varint(as_varint(t.stride(d)));
  }
  w.scalar(tensor::kStorageOffset, as_varint(t.storage_offset()));
  if (f.requires_grad) {
    w.byte(tensor::kRequiresGrad);
    w.byte(1);
  }
  w.scalar(tensor::kStorageIndex, static_cast<uint64_t>(shipped_[i].index));
}

void PlainEncoder::write(const c10::IValue& v, Writer& w) {
  const Node& node = nodes_[next_node_++];
  if (v.isNone()) {
    w.open(value::kNone, 0);
  } else if (v.isBool()) {
    w.byte(value::kBool);
    w.byte(v.toBool() ? 1 : 0);
  } else if (v.isInt()) {
    w.byte(value::kInt);
    w.varint(as_varint(v.toInt()));
  } else if (v.isDouble()) {
    w.byte(value::kDouble);
    uint64_t bits;
    const double d = v.toDouble();
    std::memcpy(&bits, &d, sizeof(bits));
    w.fixed64(bits);
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    w.open(value::kString, s.size());
    w.bytes(s.data(), s.size());
  } else if (v.isTensor()) {
    w.open(value::kTensor, node.inner);
    write_tensor(next_tensor_++, w);
  } else if (v.isTuple()) {
    w.open(value::kTuple, node.inner);
    for (const c10::IValue& elem : v.toTupleRef().elements()) {
      w.open(tuple::kElems, nodes_[next_node_].body);
      write(elem, w);
    }
  } else {  // a dict of str keys
    w.open(value::kDict, node.inner);
    w.bytes(dict::kTypes, sizeof(dict::kTypes));
    for (const auto& entry : v.toGenericDict()) {
      // A key is a string, one node: its value's node is the next.
      const size_t key = nodes_[next_node_].body;
      const size_t value = nodes_[next_node_ + 1].body;
      w.open(dict::kEntries, field_size(key) + field_size(value));
      w.open(dict::kEntryKey, key);
      write(entry.key(), w);
      w.open(dict::kEntryValue, value);
      write(entry.value(), w);
    }
  }
}

}  // namespace

bool encode_plain(const c10::IValue& value, const ContextMeta* autograd,
                  const Limits& limits, Message& out) {
  PlainEncoder encoder(limits);
  if (!encoder.scan(value, 0)) return false;
  std::vector<c10::Storage> storages;
  const size_t root = encoder.ship(value, storages);
  const bool with_autograd = autograd != nullptr && autograd->in_context();
  size_t autograd_body = 0;
  if (with_autograd) {
    autograd_body = scalar_size(as_varint(autograd->context_id)) +
                    scalar_size(as_varint(autograd->message_id)) +
                    scalar_size(as_varint(autograd->from));
  }
  const size_t size = scalar_size(kWireVersion) + scalar_size(storages.size()) +
                      (with_autograd ? field_size(autograd_body) : 0) +
                      field_size(root);
  if (size > static_cast<size_t>(INT_MAX)) return false;
  std::string payload(size, '\0');
  Writer w(reinterpret_cast<uint8_t*>(payload.data()));
  w.scalar(envelope::kVersion, kWireVersion);
  w.scalar(envelope::kStorageCount, storages.size());
  if (with_autograd) {
    w.open(envelope::kContextMeta, autograd_body);
    w.scalar(context_meta::kContextId, as_varint(autograd->context_id));
    w.scalar(context_meta::kMessageId, as_varint(autograd->message_id));
    w.scalar(context_meta::kFrom, as_varint(autograd->from));
  }
  w.open(envelope::kRoot, root);
  encoder.rewind();
  encoder.write(value, w);
  out.payload = std::move(payload);
  out.storages = std::move(storages);
  return true;
}

}  // namespace tether::wire::codec_internal
