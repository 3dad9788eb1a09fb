// decode_plain(): an envelope of plain values straight from its bytes
// (internal/codec_support.h).
//
// Protobuf's parser builds the envelope's messages on an arena before the
// decoder reads them: about 5,000 of the 9,000 instructions of decoding a
// small call. This reader takes the bytes encode_plain() writes, and only
// those: each message's fields in number order, each at most once, repeated
// int64 packed, the kinds and fields that writer writes. Anything else,
// however valid for protobuf, and anything wrong is declined, and the
// general decoder reads it (the same value, or its error, as always). So
// this reader needs no error messages of its own, and what it accepts
// decodes to what the general decoder makes of the same bytes (codec_test
// holds them equal over the writers' bytes and their mutations).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "core/wire/internal/codec_support.h"

namespace tether::wire::codec_internal {
namespace {

// Field keys of wire.proto's messages (field << 3 | wire type), as in
// plain_encoder.cc.
enum : uint8_t {
  kEnvelopeVersion = 0x08,
  kEnvelopeStorageCount = 0x10,
  kEnvelopeContextMeta = 0x1a,
  kEnvelopeRoot = 0x7a,
  kContextMetaContextId = 0x08,
  kContextMetaMessageId = 0x10,
  kContextMetaFrom = 0x18,
  kValueNone = 0x0a,
  kValueBool = 0x10,
  kValueInt = 0x18,
  kValueDouble = 0x21,
  kValueString = 0x32,
  kValueTensor = 0x42,
  kValueTuple = 0x52,
  kValueDict = 0x5a,
  kTupleElems = 0x0a,
  kDictEntries = 0x1a,
  kEntryKey = 0x0a,
  kEntryValue = 0x12,
  kTensorDefined = 0x08,
  kTensorDtype = 0x10,
  kTensorSizes = 0x1a,
  kTensorStrides = 0x22,
  kTensorStorageOffset = 0x28,
  kTensorRequiresGrad = 0x30,
  kTensorStorageIndex = 0x38,
};

// A dict's key and value types as the writers write those of keyword
// arguments (str keys, Any values): the only dicts read here.
constexpr uint8_t kKwargsTypes[] = {0x0a, 2, 0x08, 7, 0x12, 2, 0x08, 1};

// A message's bytes, read front to back.
class Reader {
 public:
  Reader(const uint8_t* begin, const uint8_t* end) : p_(begin), end_(end) {}

  bool done() const { return p_ == end_; }
  // The next field's key (one byte: every field read here is numbered
  // below 16, and 0x7a is the root's), if `key` is next; consumed then.
  bool next_is(uint8_t key) {
    if (p_ == end_ || *p_ != key) return false;
    ++p_;
    return true;
  }
  // At most 10 bytes, as protobuf reads them; false past the end or on
  // more than 64 bits.
  bool varint(uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (p_ == end_) return false;
      const uint8_t b = *p_++;
      if (shift == 63 && b > 1) return false;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) {
        *out = v;
        return true;
      }
    }
    return false;
  }
  bool fixed64(uint64_t* out) {
    if (end_ - p_ < 8) return false;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
    p_ += 8;
    *out = v;
    return true;
  }
  // A length-delimited field's bytes, as a reader of their own.
  bool sub(Reader* out) {
    uint64_t n;
    if (!varint(&n) || n > static_cast<uint64_t>(end_ - p_)) return false;
    *out = Reader(p_, p_ + n);
    p_ += n;
    return true;
  }
  // The bytes `b` next, consumed if so.
  bool next_are(const uint8_t* b, size_t n) {
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, b, n) != 0) {
      return false;
    }
    p_ += n;
    return true;
  }
  // A bool field: protobuf's encoders write 0 or 1.
  bool flag(bool* out) {
    uint64_t v;
    if (!varint(&v) || v > 1) return false;
    *out = v == 1;
    return true;
  }
  const uint8_t* data() const { return p_; }
  size_t size() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

class PlainDecoder {
 public:
  PlainDecoder(const Message& in, const Limits& limits)
      : in_(in),
        limits_(limits),
        max_depth_(effective_max_depth(limits.max_depth)) {}

  // Whether the Value message in `r` holds only the kinds value() reads:
  // a look at the keys alone, so that a message of other kinds (a call's
  // keyword arguments, a list) is declined before anything is built.
  // Containers deeper than max_depth are declined as value() declines them.
  bool plain_kinds(Reader r, int depth) const;
  // The Value message in `r`, `depth` containers deep.
  bool value(Reader r, int depth, c10::IValue* out);

 private:
  bool tensor(Reader r, at::Tensor* out);
  // A packed repeated int64 field's elements.
  bool packed(Reader r, absl::InlinedVector<int64_t, 6>* out);

  const Message& in_;
  const Limits& limits_;
  const int max_depth_;
  int64_t values_ = 0;
};

bool PlainDecoder::plain_kinds(Reader r, int depth) const {
  uint64_t v;
  Reader field(nullptr, nullptr);
  if (r.next_is(kValueBool) || r.next_is(kValueInt)) return r.varint(&v);
  if (r.next_is(kValueDouble)) return r.fixed64(&v);
  if (r.next_is(kValueNone) || r.next_is(kValueString) ||
      r.next_is(kValueTensor)) {
    return r.sub(&field);
  }
  if (r.next_is(kValueDict)) {
    if (depth + 1 > max_depth_ || !r.sub(&field) ||
        !field.next_are(kKwargsTypes, sizeof(kKwargsTypes))) {
      return false;
    }
    Reader entry(nullptr, nullptr);
    Reader part(nullptr, nullptr);
    while (!field.done()) {
      if (!field.next_is(kDictEntries) || !field.sub(&entry) ||
          !entry.next_is(kEntryKey) || !entry.sub(&part) ||
          !plain_kinds(part, depth + 1) || !entry.next_is(kEntryValue) ||
          !entry.sub(&part) || !plain_kinds(part, depth + 1) || !entry.done()) {
        return false;
      }
    }
    return r.done();
  }
  if (!r.next_is(kValueTuple) || depth + 1 > max_depth_ || !r.sub(&field)) {
    return false;
  }
  Reader elem(nullptr, nullptr);
  while (!field.done()) {
    if (!field.next_is(kTupleElems) || !field.sub(&elem) ||
        !plain_kinds(elem, depth + 1)) {
      return false;
    }
  }
  return true;
}

bool PlainDecoder::value(Reader r, int depth, c10::IValue* out) {
  // Counted as the general decoder counts: every value once.
  if (++values_ > limits_.max_values) return false;
  uint64_t v;
  if (r.next_is(kValueNone)) {
    Reader none(nullptr, nullptr);
    if (!r.sub(&none) || !none.done()) return false;
    *out = c10::IValue();
  } else if (r.next_is(kValueBool)) {
    bool b;
    if (!r.flag(&b)) return false;
    *out = c10::IValue(b);
  } else if (r.next_is(kValueInt)) {
    if (!r.varint(&v)) return false;
    *out = c10::IValue(static_cast<int64_t>(v));
  } else if (r.next_is(kValueDouble)) {
    if (!r.fixed64(&v)) return false;
    double d;
    std::memcpy(&d, &v, sizeof(d));
    *out = c10::IValue(d);
  } else if (r.next_is(kValueString)) {
    Reader s(nullptr, nullptr);
    if (!r.sub(&s)) return false;
    *out = c10::IValue(
        std::string(reinterpret_cast<const char*>(s.data()), s.size()));
  } else if (r.next_is(kValueTensor)) {
    Reader t(nullptr, nullptr);
    at::Tensor tensor;
    if (!r.sub(&t) || !this->tensor(t, &tensor)) return false;
    *out = c10::IValue(std::move(tensor));
  } else if (r.next_is(kValueTuple)) {
    if (depth + 1 > max_depth_) return false;
    Reader t(nullptr, nullptr);
    if (!r.sub(&t)) return false;
    // Counted first: plain_kinds() has checked the fields' framing.
    size_t n = 0;
    for (Reader count = t; !count.done(); ++n) {
      Reader elem(nullptr, nullptr);
      if (!count.next_is(kTupleElems) || !count.sub(&elem)) return false;
    }
    std::vector<c10::IValue> elems;
    elems.reserve(n);
    while (!t.done()) {
      Reader elem(nullptr, nullptr);
      if (!t.next_is(kTupleElems) || !t.sub(&elem)) return false;
      elems.emplace_back();
      if (!value(elem, depth + 1, &elems.back())) return false;
    }
    *out = c10::IValue(c10::ivalue::Tuple::create(std::move(elems)));
  } else if (r.next_is(kValueDict)) {
    // plain_kinds() has checked the shape: the types, then entries of a
    // key and a value. The two types count as values, as in the general
    // decoder.
    values_ += 2;
    if (depth + 1 > max_depth_ || values_ > limits_.max_values) return false;
    Reader d(nullptr, nullptr);
    if (!r.sub(&d) || !d.next_are(kKwargsTypes, sizeof(kKwargsTypes))) {
      return false;
    }
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    while (!d.done()) {
      Reader entry(nullptr, nullptr);
      Reader part(nullptr, nullptr);
      c10::IValue key;
      c10::IValue item;
      if (!d.next_is(kDictEntries) || !d.sub(&entry) ||
          !entry.next_is(kEntryKey) || !entry.sub(&part) ||
          !value(part, depth + 1, &key) || !key.isString() ||
          !entry.next_is(kEntryValue) || !entry.sub(&part) ||
          !value(part, depth + 1, &item) || !entry.done() ||
          !dict.insert(std::move(key), std::move(item)).second) {
        return false;  // a duplicate key among them
      }
    }
    *out = c10::IValue(std::move(dict));
  } else {
    return false;
  }
  // One kind, once.
  return r.done();
}

bool PlainDecoder::packed(Reader r, absl::InlinedVector<int64_t, 6>* out) {
  while (!r.done()) {
    uint64_t v;
    if (!r.varint(&v)) return false;
    // Checked here so that a hostile length cannot grow the vector past it.
    if (static_cast<int64_t>(out->size()) >= limits_.max_tensor_dims) {
      return false;
    }
    out->push_back(static_cast<int64_t>(v));
  }
  return true;
}

bool PlainDecoder::tensor(Reader r, at::Tensor* out) {
  bool defined = false;
  uint64_t dtype = 0;
  absl::InlinedVector<int64_t, 6> sizes;
  absl::InlinedVector<int64_t, 6> strides;
  uint64_t offset = 0;
  bool requires_grad = false;
  uint64_t index = 0;
  Reader packed_field(nullptr, nullptr);
  if (r.next_is(kTensorDefined) && !r.flag(&defined)) return false;
  if (r.next_is(kTensorDtype) && !r.varint(&dtype)) return false;
  if (r.next_is(kTensorSizes) &&
      (!r.sub(&packed_field) || !packed(packed_field, &sizes))) {
    return false;
  }
  if (r.next_is(kTensorStrides) &&
      (!r.sub(&packed_field) || !packed(packed_field, &strides))) {
    return false;
  }
  if (r.next_is(kTensorStorageOffset) && !r.varint(&offset)) return false;
  if (r.next_is(kTensorRequiresGrad) && !r.flag(&requires_grad)) return false;
  if (r.next_is(kTensorStorageIndex) && !r.varint(&index)) return false;
  if (!r.done()) return false;  // a sparse tensor's parts, or any other
  if (!defined) {
    // The undefined tensor carries nothing else.
    if (dtype != 0 || !sizes.empty() || !strides.empty() || offset != 0 ||
        requires_grad || index != 0) {
      return false;
    }
    *out = at::Tensor();
    return true;
  }
  c10::ScalarType type;
  if (dtype > INT32_MAX || !from_wire_dtype(static_cast<int>(dtype), &type)) {
    return false;
  }
  absl::StatusOr<at::Tensor> made = dense_tensor(
      DenseTensor{type, sizes, strides, static_cast<int64_t>(offset), index,
                  requires_grad},
      in_, Path::root());
  if (!made.ok()) return false;
  *out = *std::move(made);
  return true;
}

}  // namespace

bool decode_plain(const Message& in, const Limits& limits, c10::IValue* out,
                  ContextMeta* autograd) {
  const auto* begin = reinterpret_cast<const uint8_t*>(in.payload.data());
  Reader r(begin, begin + in.payload.size());
  uint64_t version = 0;
  uint64_t storage_count = 0;
  if (r.next_is(kEnvelopeVersion) && !r.varint(&version)) return false;
  if (version != kWireVersion) return false;
  if (r.next_is(kEnvelopeStorageCount) && !r.varint(&storage_count)) {
    return false;
  }
  if (storage_count != in.storages.size()) return false;
  ContextMeta meta;
  if (r.next_is(kEnvelopeContextMeta)) {
    Reader a(nullptr, nullptr);
    uint64_t context_id = 0;
    uint64_t message_id = 0;
    uint64_t from = 0;
    if (!r.sub(&a)) return false;
    if (a.next_is(kContextMetaContextId) && !a.varint(&context_id))
      return false;
    if (a.next_is(kContextMetaMessageId) && !a.varint(&message_id))
      return false;
    if (a.next_is(kContextMetaFrom) && !a.varint(&from)) return false;
    if (!a.done()) return false;
    // As the general decoder checks them; `from` is an int32 on the wire,
    // which a non-negative one fits.
    meta.context_id = static_cast<int64_t>(context_id);
    meta.message_id = static_cast<int64_t>(message_id);
    if (meta.context_id < 0 || meta.message_id < -1 || from > INT32_MAX) {
      return false;
    }
    meta.from = static_cast<int32_t>(from);
  }
  Reader root(nullptr, nullptr);
  if (!r.next_is(kEnvelopeRoot) || !r.sub(&root) || !r.done()) return false;
  PlainDecoder decoder(in, limits);
  c10::IValue value;
  if (!decoder.plain_kinds(root, 0) || !decoder.value(root, 0, &value)) {
    return false;
  }
  *out = std::move(value);
  if (autograd != nullptr) *autograd = meta;
  return true;
}

}  // namespace tether::wire::codec_internal
