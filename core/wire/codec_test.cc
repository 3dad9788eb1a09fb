#include "core/wire/codec.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/class_type.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/quantize_per_tensor.h>
#include <ATen/ops/sparse_coo_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <absl/strings/escaping.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/message.h"
#include "core/wire/capsules.h"
#include "core/wire/profiled.h"
#include "core/wire/wire.pb.h"
#include "testing/status_matchers.h"

namespace tether::wire {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

// --- helpers ---------------------------------------------------------------

// Encoded as deep as the codec goes, for tests of what decode refuses.
Message encoded(const c10::IValue& value) {
  Limits widest;
  widest.max_depth = kMaxSupportedDepth;
  Message message;
  absl::Status status = encode(value, message, nullptr, nullptr, widest);
  EXPECT_THAT(status, IsOk());
  return message;
}

c10::IValue round_trip(const c10::IValue& value) {
  Message message = encoded(value);
  absl::StatusOr<c10::IValue> decoded = decode(message);
  EXPECT_THAT(decoded, IsOk());
  return decoded.ok() ? *decoded : c10::IValue("decode failed");
}

Envelope envelope_of(const Message& message) {
  Envelope envelope;
  EXPECT_TRUE(envelope.ParseFromString(message.payload));
  return envelope;
}

void set_envelope(Message& message, const Envelope& envelope) {
  message.payload = envelope.SerializeAsString();
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  if (a.numel() == 0) return true;
  at::Tensor ca = a.detach().contiguous();
  at::Tensor cb = b.detach().contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(),
                     ca.numel() * ca.element_size()) == 0;
}

// Structural equality: kinds, container types, order, tensor values.
::testing::AssertionResult same(const c10::IValue& a, const c10::IValue& b,
                                const std::string& where = "root") {
  auto fail = [&](const std::string& why) {
    return ::testing::AssertionFailure()
           << where << ": " << why << " (" << a.tagKind() << " vs "
           << b.tagKind() << ")";
  };
  if (a.tagKind() != b.tagKind()) return fail("kinds differ");
  if (a.isNone()) return ::testing::AssertionSuccess();
  if (a.isBool()) {
    return a.toBool() == b.toBool() ? ::testing::AssertionSuccess()
                                    : fail("bools differ");
  }
  if (a.isInt()) {
    return a.toInt() == b.toInt() ? ::testing::AssertionSuccess()
                                  : fail("ints differ");
  }
  if (a.isDouble()) {
    double x = a.toDouble();
    double y = b.toDouble();
    return (x == y || (std::isnan(x) && std::isnan(y)))
               ? ::testing::AssertionSuccess()
               : fail("doubles differ");
  }
  if (a.isComplexDouble()) {
    return a.toComplexDouble() == b.toComplexDouble()
               ? ::testing::AssertionSuccess()
               : fail("complexes differ");
  }
  if (a.isString()) {
    return a.toStringRef() == b.toStringRef() ? ::testing::AssertionSuccess()
                                              : fail("strings differ");
  }
  if (a.isDevice()) {
    return a.toDevice() == b.toDevice() ? ::testing::AssertionSuccess()
                                        : fail("devices differ");
  }
  if (a.isTensor()) {
    const at::Tensor& x = a.toTensor();
    const at::Tensor& y = b.toTensor();
    if (x.defined() != y.defined()) return fail("definedness differs");
    if (!x.defined()) return ::testing::AssertionSuccess();
    if (x.requires_grad() != y.requires_grad()) {
      return fail("requires_grad differs");
    }
    return bitwise_equal(x, y) ? ::testing::AssertionSuccess()
                               : fail("tensors differ");
  }
  if (a.isList()) {
    auto x = a.toList();
    auto y = b.toList();
    if (*x.elementType() != *y.elementType()) {
      return fail("list types differ: " + x.elementType()->repr_str() + " vs " +
                  y.elementType()->repr_str());
    }
    if (x.size() != y.size()) return fail("list sizes differ");
    for (size_t i = 0; i < x.size(); ++i) {
      auto r = same(x.get(i), y.get(i), where + "[" + std::to_string(i) + "]");
      if (!r) return r;
    }
    return ::testing::AssertionSuccess();
  }
  if (a.isTuple()) {
    const auto& x = a.toTupleRef().elements();
    const auto& y = b.toTupleRef().elements();
    if (x.size() != y.size()) return fail("tuple sizes differ");
    for (size_t i = 0; i < x.size(); ++i) {
      auto r = same(x[i], y[i], where + "[" + std::to_string(i) + "]");
      if (!r) return r;
    }
    return ::testing::AssertionSuccess();
  }
  if (a.isGenericDict()) {
    auto x = a.toGenericDict();
    auto y = b.toGenericDict();
    if (*x.keyType() != *y.keyType() || *x.valueType() != *y.valueType()) {
      return fail("dict types differ");
    }
    if (x.size() != y.size()) return fail("dict sizes differ");
    auto xi = x.begin();
    auto yi = y.begin();
    for (int i = 0; xi != x.end(); ++xi, ++yi, ++i) {
      auto r =
          same(xi->key(), yi->key(), where + "{key " + std::to_string(i) + "}");
      if (!r) return r;
      r = same(xi->value(), yi->value(),
               where + "{value " + std::to_string(i) + "}");
      if (!r) return r;
    }
    return ::testing::AssertionSuccess();
  }
  return fail("unexpected kind");
}

c10::IValue tuple_of(std::vector<c10::IValue> elems) {
  return c10::ivalue::Tuple::create(std::move(elems));
}

at::Tensor float_range(int64_t n) {
  return at::arange(n, at::TensorOptions().dtype(at::kFloat));
}

// A value with a bit of everything, for the fuzz-style tests.
c10::IValue rich_value() {
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("weight", float_range(6).reshape({2, 3}));
  dict.insert("bias", at::zeros({3}, at::kDouble));
  c10::List<int64_t> ints({1, 2, 3});
  c10::List<c10::optional<at::Tensor>> maybe;
  maybe.push_back(c10::nullopt);
  maybe.push_back(at::ones({2}, at::kLong));
  return tuple_of({c10::IValue("aten::add"), tuple_of({ints, 2.5, true}), dict,
                   maybe, c10::complex<double>(1, -2)});
}

// --- round trips -------------------------------------------------------------

TEST(CodecRoundTrip, Scalars) {
  std::vector<c10::IValue> values = {
      c10::IValue(),
      true,
      false,
      int64_t{0},
      std::numeric_limits<int64_t>::min(),
      std::numeric_limits<int64_t>::max(),
      0.0,
      -1.5e300,
      std::numeric_limits<double>::infinity(),
      std::numeric_limits<double>::quiet_NaN(),
      c10::complex<double>(3.5, -0.25),
      std::string(""),
      std::string("hello"),
      std::string("\0bin\xff\xfe ary", 11),
      c10::Device(c10::kCPU),
      c10::Device(c10::kCPU, 0),
  };
  for (const c10::IValue& v : values) {
    EXPECT_TRUE(same(v, round_trip(v))) << v;
  }
}

TEST(CodecRoundTrip, Tensor) {
  at::Tensor t = float_range(12).reshape({3, 4});
  c10::IValue back = round_trip(t);
  ASSERT_TRUE(back.isTensor());
  EXPECT_TRUE(at::equal(back.toTensor(), t));
  EXPECT_EQ(back.toTensor().strides(), t.strides());
}

// The sparse COO tensor of `indices` ([sparse_dim, nnz]) and `values`.
at::Tensor sparse(std::vector<int64_t> indices, int64_t sparse_dim,
                  const at::Tensor& values, std::vector<int64_t> sizes) {
  at::Tensor i = at::tensor(indices, at::kLong).reshape({sparse_dim, -1});
  return at::sparse_coo_tensor(i, values, sizes);
}

// Layout, sizes, coalesced flag, grad flag and the parts bit for bit.
void expect_same_sparse(const at::Tensor& a, const c10::IValue& back) {
  ASSERT_TRUE(back.isTensor());
  const at::Tensor& b = back.toTensor();
  ASSERT_EQ(b.layout(), c10::kSparse);
  EXPECT_EQ(b.sizes(), a.sizes());
  EXPECT_EQ(b.sparse_dim(), a.sparse_dim());
  EXPECT_EQ(b.is_coalesced(), a.is_coalesced());
  EXPECT_EQ(b.requires_grad(), a.requires_grad());
  EXPECT_TRUE(bitwise_equal(b._indices(), a._indices()));
  EXPECT_TRUE(bitwise_equal(b._values(), a._values()));
}

TEST(CodecTensor, SparseCooRoundTrips) {
  // Uncoalesced, with a repeated index: it stays so.
  at::Tensor loose = sparse({2, 0, 2, 1, 0, 1}, 2, float_range(3), {3, 2});
  ASSERT_FALSE(loose.is_coalesced());
  expect_same_sparse(loose, round_trip(loose));
  at::Tensor tight = loose.coalesce();
  expect_same_sparse(tight, round_trip(tight));
  // Hybrid: 1 sparse dim, 1 dense dim of 2.
  at::Tensor hybrid =
      sparse({0, 3}, 1, float_range(4).reshape({2, 2}).to(at::kDouble), {5, 2});
  expect_same_sparse(hybrid, round_trip(hybrid));
  at::Tensor empty = sparse({}, 2, at::zeros({0}), {4, 4});
  expect_same_sparse(empty, round_trip(empty));
  at::Tensor grad = loose.clone().requires_grad_(true);
  expect_same_sparse(grad, round_trip(grad));
  // Beside a dense tensor in a tuple, both intact.
  c10::IValue both = round_trip(tuple_of({tight, float_range(2)}));
  expect_same_sparse(tight, both.toTupleRef().elements()[0]);
  EXPECT_TRUE(same(float_range(2), both.toTupleRef().elements()[1]));
}

TEST(CodecRoundTrip, UndefinedTensor) {
  c10::IValue back = round_trip(at::Tensor());
  ASSERT_TRUE(back.isTensor());
  EXPECT_FALSE(back.toTensor().defined());
}

TEST(CodecRoundTrip, NestedContainers) {
  c10::impl::GenericList any_list(c10::AnyType::get());
  any_list.push_back(int64_t{1});
  any_list.push_back("two");
  any_list.push_back(tuple_of({3.0, c10::IValue()}));
  c10::impl::GenericDict kwargs(c10::StringType::get(), c10::AnyType::get());
  kwargs.insert("alpha", 2.0);
  kwargs.insert("list", any_list);
  c10::IValue v =
      tuple_of({c10::IValue("name"),
                tuple_of({tuple_of({tuple_of({int64_t{7}})}), tuple_of({})}),
                kwargs, rich_value()});
  EXPECT_TRUE(same(v, round_trip(v)));
}

TEST(CodecRoundTrip, FunctionReferencesKeepTheirName) {
  c10::impl::GenericList refs(c10::AnyType::get());
  refs.push_back(FunctionRef::make("py::pkg.mod:Cls.method"));
  refs.push_back(FunctionRef::make("aten::add"));
  c10::IValue back = round_trip(tuple_of({refs, int64_t{1}}));
  ASSERT_TRUE(back.isTuple());
  c10::IValue list = back.toTupleRef().elements()[0];
  ASSERT_TRUE(list.isList());
  ASSERT_EQ(list.toListRef().size(), 2u);
  const FunctionRef* first = FunctionRef::of(list.toListRef()[0]);
  const FunctionRef* second = FunctionRef::of(list.toListRef()[1]);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(first->name, "py::pkg.mod:Cls.method");
  EXPECT_EQ(second->name, "aten::add");
}

TEST(CodecRoundTrip, DtypesLayoutsAndMemoryFormatsKeepTheirKind) {
  using Kind = TorchEnum::Kind;
  const std::vector<std::pair<Kind, int64_t>> values = {
      {Kind::kDtype, static_cast<int64_t>(at::kFloat)},
      {Kind::kDtype, static_cast<int64_t>(at::kBool)},
      {Kind::kDtype, static_cast<int64_t>(at::kComplexDouble)},
      {Kind::kLayout, static_cast<int64_t>(c10::kStrided)},
      {Kind::kLayout, static_cast<int64_t>(c10::kSparse)},
      {Kind::kMemoryFormat,
       static_cast<int64_t>(c10::MemoryFormat::ChannelsLast)},
  };
  for (const auto& [kind, value] : values) {
    c10::IValue back = round_trip(TorchEnum::make(kind, value));
    const TorchEnum* e = TorchEnum::of(back);
    ASSERT_NE(e, nullptr) << value;
    EXPECT_EQ(e->kind, kind);
    EXPECT_EQ(e->value, value);
  }
  Message message;
  EXPECT_THAT(encode(TorchEnum::make(Kind::kDtype,
                                     static_cast<int64_t>(at::kQInt8)),
                     message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("torch enum at root: unsupported value "
                                 "QInt8 (a dtype)")));
  // An unknown wire number is refused on decode.
  message = encoded(tuple_of({TorchEnum::make(Kind::kLayout, 0)}));
  Envelope envelope = envelope_of(message);
  envelope.mutable_root()->mutable_tuple()->mutable_elems(0)
      ->mutable_torch_enum()->set_value(99);
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("torch enum at root[0]: unknown value 99")));
}

TEST(CodecRoundTrip, PickledObjectsKeepTheirBytesAndLiftedTensors) {
  const std::string data("\x80\x05\x00binary\npickle", 18);
  at::Tensor t = at::arange(6, at::kFloat).reshape({2, 3});
  c10::IValue back = round_trip(
      tuple_of({Pickled::make(data, {t, c10::IValue(int64_t{3})}), 1.5}));
  const Pickled* p = Pickled::of(back.toTupleRef().elements()[0]);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->data, data);
  ASSERT_EQ(p->objects.size(), 2u);
  ASSERT_TRUE(p->objects[0].isTensor());
  EXPECT_TRUE(at::equal(p->objects[0].toTensor(), t));
  EXPECT_EQ(p->objects[1].toInt(), 3);
  // Its tensors travel out of band, as any tensor's.
  EXPECT_EQ(encoded(Pickled::make(data, {t})).storages.size(), 1u);
}

TEST(CodecEncode, PickledObjectsCountTowardsTheDepthLimit) {
  c10::IValue v = Pickled::make("x", {});
  for (int i = 0; i < 70; ++i) v = Pickled::make("x", {v});
  Message message;
  EXPECT_THAT(encode(v, message),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("nested deeper than 64")));
}

// A front end's object, as a front end keeps it in an IValue (Python's
// holds a PyObject; the codec never looks inside).
struct FrontEndObject : c10::ivalue::PyObjectHolder {
  PyObject* getPyObject() override { return nullptr; }
  c10::InferredType tryToInferType() override {
    return c10::InferredType(c10::AnyType::get());
  }
  c10::IValue toIValue(const c10::TypePtr&, c10::optional<int32_t>) override {
    return c10::IValue();
  }
  std::string toStr() override { return "object"; }
  std::vector<at::Tensor> extractTensors() override { return {}; }
};

absl::StatusOr<c10::IValue> pickle_as_marker(const c10::IValue&) {
  return Pickled::make("marker", {});
}

TEST(CodecEncode, FrontEndObjectsTravelAsTheirEncoderPicklesThem) {
  c10::IValue object(c10::intrusive_ptr<c10::ivalue::PyObjectHolder>(
      c10::make_intrusive<FrontEndObject>()));
  Message message;
  set_object_encoder(nullptr);
  EXPECT_THAT(encode(tuple_of({object}), message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("value at root[0]: a Python object, and no "
                                 "front end in this process encodes")));
  set_object_encoder(&pickle_as_marker);
  c10::IValue back = round_trip(tuple_of({object}));
  set_object_encoder(nullptr);
  const Pickled* p = Pickled::of(back.toTupleRef().elements()[0]);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->data, "marker");
}

TEST(CodecEncode, EmptyFunctionReferenceIsRefusedEitherWay) {
  Message message;
  EXPECT_THAT(encode(FunctionRef::make(""), message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("function reference at root: empty name")));
  message = encoded(FunctionRef::make("f"));
  Envelope envelope = envelope_of(message);
  envelope.mutable_root()->mutable_function_ref()->clear_name();
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty name")));
}

TEST(CodecRoundTrip, EmptyContainers) {
  std::vector<c10::IValue> values = {
      c10::List<int64_t>(),
      c10::List<at::Tensor>(),
      c10::impl::GenericList(c10::AnyType::get()),
      tuple_of({}),
      c10::impl::GenericDict(c10::StringType::get(), c10::TensorType::get()),
      c10::impl::GenericDict(c10::IntType::get(), c10::ListType::ofInts()),
  };
  for (const c10::IValue& v : values) {
    EXPECT_TRUE(same(v, round_trip(v))) << v;
  }
}

TEST(CodecRoundTrip, TypedListsKeepTheirElementType) {
  c10::IValue ints = round_trip(c10::List<int64_t>({1, -2, 3}));
  EXPECT_TRUE(ints.isIntList());
  EXPECT_EQ(ints.toIntVector(), (std::vector<int64_t>{1, -2, 3}));

  c10::IValue doubles = round_trip(c10::List<double>({1.5, -2.0}));
  EXPECT_TRUE(doubles.isDoubleList());
  EXPECT_EQ(doubles.toDoubleVector(), (std::vector<double>{1.5, -2.0}));

  c10::IValue bools = round_trip(c10::List<bool>({true, false, true}));
  EXPECT_TRUE(bools.isBoolList());
  EXPECT_EQ(bools.toBoolList().get(2), true);

  c10::IValue strings = round_trip(c10::List<std::string>({"a", "bc"}));
  ASSERT_TRUE(strings.isList());
  EXPECT_EQ(*strings.toList().elementType(), *c10::StringType::get());
  EXPECT_EQ(strings.toList().get(1).toStringRef(), "bc");

  c10::IValue tensors = round_trip(
      c10::List<at::Tensor>({float_range(3), at::Tensor(), float_range(2)}));
  EXPECT_TRUE(tensors.isTensorList());
  EXPECT_FALSE(tensors.toTensorVector()[1].defined());

  c10::List<c10::optional<at::Tensor>> maybe;
  maybe.push_back(float_range(2));
  maybe.push_back(c10::nullopt);
  c10::IValue maybe_back = round_trip(maybe);
  EXPECT_TRUE(maybe_back.isOptionalTensorList());
  EXPECT_TRUE(same(maybe, maybe_back));

  c10::IValue complexes =
      round_trip(c10::List<c10::complex<double>>({{1, 2}, {3, 4}}));
  EXPECT_TRUE(complexes.isComplexDoubleList());

  c10::List<c10::List<int64_t>> nested;
  nested.push_back(c10::List<int64_t>({1}));
  nested.push_back(c10::List<int64_t>());
  c10::IValue nested_back = round_trip(nested);
  EXPECT_EQ(nested_back.toList().elementType()->repr_str(), "List[int]");
  EXPECT_TRUE(nested_back.toList().get(0).isIntList());

  c10::impl::GenericList pairs(
      c10::TupleType::create({c10::IntType::get(), c10::StringType::get()}));
  pairs.push_back(tuple_of({int64_t{1}, c10::IValue("x")}));
  c10::IValue pairs_back = round_trip(pairs);
  EXPECT_EQ(pairs_back.toList().elementType()->repr_str(), "Tuple[int, str]");
  EXPECT_TRUE(same(pairs, pairs_back));
}

TEST(CodecRoundTrip, DictsKeepTypesAndInsertionOrder) {
  c10::Dict<std::string, at::Tensor> by_name;
  by_name.insert("zeta", float_range(2));
  by_name.insert("alpha", float_range(3));
  by_name.insert("mid", at::Tensor());
  c10::IValue back = round_trip(by_name);
  ASSERT_TRUE(back.isGenericDict());
  auto dict = back.toGenericDict();
  EXPECT_EQ(*dict.keyType(), *c10::StringType::get());
  EXPECT_EQ(*dict.valueType(), *c10::TensorType::get());
  std::vector<std::string> keys;
  for (const auto& entry : dict) keys.push_back(entry.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{"zeta", "alpha", "mid"}));
  EXPECT_TRUE(same(by_name, back));

  c10::Dict<int64_t, c10::optional<double>> by_int;
  by_int.insert(5, 1.0);
  by_int.insert(-1, c10::nullopt);
  c10::IValue int_back = round_trip(by_int);
  EXPECT_EQ(int_back.toGenericDict().valueType()->repr_str(),
            "Optional[float]");
  EXPECT_TRUE(same(by_int, int_back));
}

// --- tensors -----------------------------------------------------------------

TEST(CodecTensor, EveryDtypeRoundTrips) {
  const std::vector<c10::ScalarType> dtypes = {
      at::kByte,        at::kChar,         at::kShort,         at::kInt,
      at::kLong,        at::kHalf,         at::kFloat,         at::kDouble,
      at::kComplexHalf, at::kComplexFloat, at::kComplexDouble, at::kBool,
      at::kBFloat16,
  };
  for (c10::ScalarType dtype : dtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor source = at::arange(24, at::kDouble).reshape({2, 3, 4}).div(4);
    at::Tensor t = dtype == at::kComplexHalf
                       ? source.to(at::kComplexFloat).to(dtype)
                       : source.to(dtype);
    const bool grad = c10::isFloatingType(dtype) || c10::isComplexType(dtype);
    if (grad) t.set_requires_grad(true);
    c10::IValue back = round_trip(t);
    ASSERT_TRUE(back.isTensor());
    const at::Tensor& d = back.toTensor();
    EXPECT_EQ(d.scalar_type(), dtype);
    EXPECT_EQ(d.sizes(), t.sizes());
    EXPECT_EQ(d.requires_grad(), grad);
    EXPECT_TRUE(d.is_leaf());
    EXPECT_TRUE(bitwise_equal(d, t));
    if (dtype != at::kComplexHalf) {  // at::equal has no ComplexHalf kernel.
      EXPECT_TRUE(at::equal(d.detach(), t.detach()));
    }
  }
}

TEST(CodecTensor, NanValuesSurviveBitForBit) {
  at::Tensor t = float_range(4);
  t[1] = std::numeric_limits<float>::quiet_NaN();
  c10::IValue back = round_trip(t);
  EXPECT_TRUE(bitwise_equal(back.toTensor(), t));
}

TEST(CodecTensor, NonLeafArrivesAsLeafRequiringGrad) {
  at::Tensor a = float_range(3).set_requires_grad(true);
  at::Tensor b = a.mul(2);
  ASSERT_FALSE(b.is_leaf());
  at::Tensor d = round_trip(b).toTensor();
  EXPECT_TRUE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_TRUE(at::equal(d.detach(), b.detach()));
}

TEST(CodecTensor, TransposeShipsStorageWithItsStrides) {
  at::Tensor base = float_range(12).reshape({3, 4});
  at::Tensor t = base.t();
  Message message = encoded(t);
  ASSERT_EQ(message.storages.size(), 1u);
  // Zero copy: the very storage.
  EXPECT_TRUE(message.storages[0].is_alias_of(base.storage()));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_EQ(d.strides(), t.strides());
  EXPECT_TRUE(at::equal(d, t));
}

TEST(CodecTensor, StepSliceSpanningTheStorageKeepsStrides) {
  at::Tensor t = float_range(20).reshape({4, 5}).slice(1, 0, 5, 2);
  Message message = encoded(t);
  ASSERT_EQ(message.storages.size(), 1u);
  EXPECT_EQ(message.storages[0].nbytes(), 20 * sizeof(float));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_EQ(d.strides(), t.strides());
  EXPECT_TRUE(at::equal(d, t));
}

TEST(CodecTensor, StepSliceOfPartOfASmallStorageKeepsItsStrides) {
  at::Tensor base = float_range(20);
  at::Tensor t = base.slice(0, 1, 20, 3);  // 1, 4, ..., 19
  Message message = encoded(t);
  ASSERT_EQ(message.storages.size(), 1u);
  EXPECT_TRUE(message.storages[0].is_alias_of(base.storage()));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_FALSE(d.is_contiguous());
  EXPECT_EQ(d.strides(), t.strides());
  EXPECT_EQ(d.storage_offset(), 1);
  EXPECT_TRUE(at::equal(d, t));
}

TEST(CodecTensor, StepSliceOfALargeStorageIsCompacted) {
  at::Tensor t = float_range(4096).slice(0, 1, 4096, 3);  // a third of 16 KiB
  Message message = encoded(t);
  ASSERT_EQ(message.storages.size(), 1u);
  EXPECT_EQ(message.storages[0].nbytes(), t.numel() * sizeof(float));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_TRUE(d.is_contiguous());
  EXPECT_TRUE(at::equal(d, t));
}

TEST(CodecTensor, ViewOfHalfOrMoreOfALargeStorageKeepsItsStrides) {
  // 40 of 64 columns: 10 KiB of a 16 KiB storage, not wasteful enough.
  at::Tensor t = float_range(4096).reshape({64, 64}).slice(1, 0, 40);
  Message message = encoded(t);
  ASSERT_EQ(message.storages.size(), 1u);
  EXPECT_EQ(message.storages[0].nbytes(), 4096 * sizeof(float));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_EQ(d.strides(), t.strides());
  EXPECT_TRUE(at::equal(d, t));
}

TEST(CodecTensor, CompactionStartsAtAStorageOfEightKiB) {
  // One element of each: the storage just under 8 KiB travels whole, the one
  // of 8 KiB is compacted.
  at::Tensor under = float_range(2047).slice(0, 5, 6);
  at::Tensor at_limit = float_range(2048).slice(0, 5, 6);
  Message message = encoded(tuple_of({under, at_limit}));
  ASSERT_EQ(message.storages.size(), 2u);
  EXPECT_EQ(message.storages[0].nbytes(), 2047 * sizeof(float));
  EXPECT_EQ(message.storages[1].nbytes(), sizeof(float));
  c10::IValue back = *decode(message);
  const auto& elems = back.toTupleRef().elements();
  EXPECT_EQ(elems[0].toTensor().storage_offset(), 5);
  EXPECT_EQ(elems[1].toTensor().storage_offset(), 0);
  EXPECT_TRUE(at::equal(elems[0].toTensor(), under));
  EXPECT_TRUE(at::equal(elems[1].toTensor(), at_limit));
}

TEST(CodecTensor, ExpandKeepsZeroStrides) {
  at::Tensor t = float_range(3).expand({4, 3});
  Message message = encoded(t);
  ASSERT_EQ(message.storages.size(), 1u);
  EXPECT_EQ(message.storages[0].nbytes(), 3 * sizeof(float));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_EQ(d.strides(), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(at::equal(d, t));
}

TEST(CodecTensor, SmallViewOfLargeStorageIsNotShippedWhole) {
  at::Tensor big = float_range(1 << 20);
  at::Tensor view = big.slice(0, 100, 110);
  Message message = encoded(view);
  ASSERT_EQ(message.storages.size(), 1u);
  EXPECT_EQ(message.storages[0].nbytes(), 10 * sizeof(float));
  EXPECT_FALSE(message.storages[0].is_alias_of(big.storage()));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_TRUE(at::equal(d, view));
  EXPECT_EQ(d.storage_offset(), 0);
}

TEST(CodecTensor, SharedStorageShipsOnceAndAliasesAfterDecode) {
  at::Tensor a = float_range(24).reshape({4, 6});
  at::Tensor b = a.t();
  at::Tensor c = a.view({24});
  Message message = encoded(tuple_of({a, b, c}));
  ASSERT_EQ(message.storages.size(), 1u);
  c10::IValue back = *decode(message);
  const auto& elems = back.toTupleRef().elements();
  at::Tensor da = elems[0].toTensor();
  at::Tensor db = elems[1].toTensor();
  at::Tensor dc = elems[2].toTensor();
  EXPECT_TRUE(da.is_alias_of(db));
  EXPECT_TRUE(da.is_alias_of(dc));
  da[1][0] = 42.0;
  EXPECT_EQ(db[0][1].item<float>(), 42.0f);
  EXPECT_EQ(dc[6].item<float>(), 42.0f);
}

TEST(CodecTensor, ViewOfAStorageShippedWholeReferencesItInsteadOfCloning) {
  at::Tensor a = float_range(10);
  at::Tensor part = a.slice(0, 2, 5);
  Message message = encoded(tuple_of({part, a}));
  ASSERT_EQ(message.storages.size(), 1u);
  c10::IValue back = *decode(message);
  const auto& elems = back.toTupleRef().elements();
  EXPECT_TRUE(elems[0].toTensor().is_alias_of(elems[1].toTensor()));
  EXPECT_EQ(elems[0].toTensor().storage_offset(), 2);
  EXPECT_TRUE(at::equal(elems[0].toTensor(), part));
}

TEST(CodecTensor, SameCompactedViewTwiceIsClonedOnce) {
  at::Tensor view = float_range(4096).slice(0, 0, 10);
  Message message = encoded(tuple_of({view, view}));
  ASSERT_EQ(message.storages.size(), 1u);
  EXPECT_EQ(message.storages[0].nbytes(), 10 * sizeof(float));
  c10::IValue back = *decode(message);
  const auto& elems = back.toTupleRef().elements();
  EXPECT_TRUE(elems[0].toTensor().is_alias_of(elems[1].toTensor()));
}

TEST(CodecTensor, ZeroSizeTensors) {
  at::Tensor empty = at::zeros({0, 3});
  at::Tensor empty_view = float_range(50).slice(0, 10, 10);
  Message message = encoded(tuple_of({empty, empty_view}));
  for (const c10::Storage& s : message.storages) EXPECT_EQ(s.nbytes(), 0u);
  c10::IValue back = *decode(message);
  const auto& elems = back.toTupleRef().elements();
  EXPECT_EQ(elems[0].toTensor().sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(elems[1].toTensor().sizes(), (std::vector<int64_t>{0}));
}

TEST(CodecTensor, ZeroDimScalars) {
  at::Tensor scalar = at::ones({}, at::kDouble).mul(3);
  at::Tensor element = float_range(4096).select(0, 42);  // 0-dim view
  Message message = encoded(tuple_of({scalar, element}));
  ASSERT_EQ(message.storages.size(), 2u);
  EXPECT_EQ(message.storages[1].nbytes(), sizeof(float));
  c10::IValue back = *decode(message);
  const auto& elems = back.toTupleRef().elements();
  EXPECT_EQ(elems[0].toTensor().dim(), 0);
  EXPECT_EQ(elems[0].toTensor().item<double>(), 3.0);
  EXPECT_EQ(elems[1].toTensor().dim(), 0);
  EXPECT_EQ(elems[1].toTensor().item<float>(), 42.0f);
}

TEST(CodecTensor, ConjugateViewArrivesResolved) {
  at::Tensor z = at::arange(4, at::kDouble)
                     .to(at::kComplexDouble)
                     .mul(c10::complex<double>(1, 1));
  at::Tensor conj = z.conj();
  ASSERT_TRUE(conj.is_conj());
  at::Tensor d = round_trip(conj).toTensor();
  EXPECT_FALSE(d.is_conj());
  EXPECT_TRUE(at::equal(d, conj.resolve_conj()));
}

TEST(CodecTensor, RepeatedConjugateViewIsMaterializedOnce) {
  at::Tensor conj = at::arange(4, at::kFloat).to(at::kComplexFloat).conj();
  Message message = encoded(tuple_of({conj, conj}));
  EXPECT_EQ(message.storages.size(), 1u);
}

TEST(CodecTensor, DecodedTensorsShareTheMessageStorages) {
  Message message = encoded(float_range(8));
  at::Tensor d = decode(message)->toTensor();
  EXPECT_TRUE(d.storage().is_alias_of(message.storages[0]));
}

// --- unsupported kinds on encode --------------------------------------------

void expect_unsupported(const c10::IValue& v, const std::string& name) {
  Message message;
  message.payload = "untouched";
  EXPECT_THAT(encode(v, message),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(name)));
  EXPECT_EQ(message.payload, "untouched");
}

// --- the direct writer of plain values -------------------------------------

// encode() writes plain values (None, bool, int, float, str, tuples, strided
// CPU tensors, keyword arguments' dicts) without protobuf's messages: its bytes and storages must be
// those of the messages' encoder, for every kind and field it writes.
void expect_as_through_messages(const c10::IValue& value,
                                const ContextMeta* autograd = nullptr,
                                const Limits& limits = Limits()) {
  SCOPED_TRACE(value.tagKind());
  Message direct;
  Message reference;
  ASSERT_THAT(encode(value, direct, nullptr, autograd, limits), IsOk());
  ASSERT_THAT(internal::encode_through_messages(value, reference, nullptr,
                                                autograd, limits),
              IsOk());
  EXPECT_EQ(absl::CHexEscape(direct.payload),
            absl::CHexEscape(reference.payload));
  ASSERT_EQ(direct.storages.size(), reference.storages.size());
  for (size_t i = 0; i < direct.storages.size(); ++i) {
    const c10::Storage& a = direct.storages[i];
    const c10::Storage& b = reference.storages[i];
    ASSERT_EQ(a.nbytes(), b.nbytes());
    // The same storage when it travels whole, equal bytes when cloned.
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << i;
  }
}

TEST(CodecPlain, ScalarsAndStringsAreProtobufsBytes) {
  for (const c10::IValue& v : std::vector<c10::IValue>{
           c10::IValue(), c10::IValue(true), c10::IValue(false),
           c10::IValue(int64_t{0}), c10::IValue(int64_t{1}),
           c10::IValue(int64_t{127}), c10::IValue(int64_t{128}),
           c10::IValue(int64_t{-1}),
           c10::IValue(std::numeric_limits<int64_t>::min()),
           c10::IValue(std::numeric_limits<int64_t>::max()),
           c10::IValue(0.0), c10::IValue(-0.0), c10::IValue(1.5),
           c10::IValue(std::numeric_limits<double>::quiet_NaN()),
           c10::IValue(std::string()), c10::IValue(std::string("a")),
           c10::IValue(std::string(127, 'x')),
           c10::IValue(std::string(128, 'y')),
           c10::IValue(std::string(70000, 'z')),
           c10::IValue(std::string("nul\0byte", 8))}) {
    expect_as_through_messages(v);
  }
}

TEST(CodecPlain, TuplesAreProtobufsBytes) {
  using c10::ivalue::Tuple;
  expect_as_through_messages(Tuple::create({}));
  expect_as_through_messages(Tuple::create({c10::IValue()}));
  expect_as_through_messages(Tuple::create(
      {c10::IValue(std::string("aten::add.Scalar")),
       Tuple::create({c10::IValue(at::ones({2})), 1.0}), c10::IValue()}));
  // Deep enough that lengths take two bytes at the outer levels.
  c10::IValue deep(std::string(100, 'n'));
  for (int i = 0; i < 20; ++i) {
    deep = Tuple::create({deep, c10::IValue(int64_t{i}), Tuple::create({})});
  }
  expect_as_through_messages(deep);
}

// Keyword arguments as a Worker sends them: str keys, Any values.
c10::IValue kwargs_of(std::vector<std::pair<std::string, c10::IValue>> items) {
  c10::impl::GenericDict kwargs(c10::StringType::get(), c10::AnyType::get());
  for (auto& [k, v] : items) kwargs.insert(k, v);
  return c10::IValue(kwargs);
}

TEST(CodecPlain, KeywordArgumentsAreProtobufsBytes) {
  using c10::ivalue::Tuple;
  expect_as_through_messages(kwargs_of({}));
  expect_as_through_messages(kwargs_of({{"alpha", c10::IValue(2.0)}}));
  expect_as_through_messages(Tuple::create(
      {c10::IValue(std::string("aten::add.Tensor")),
       Tuple::create({c10::IValue(at::ones({2}))}),
       kwargs_of({{"other", c10::IValue(at::ones({2}))},
                  {std::string(200, 'k'), c10::IValue()},
                  {"", kwargs_of({{"nested", Tuple::create({})}})}})}));
}

TEST(CodecPlain, TensorsAreProtobufsBytes) {
  using c10::ivalue::Tuple;
  const at::Tensor base = at::arange(24, at::kFloat).reshape({2, 3, 4});
  const at::Tensor large = at::arange(4096, at::kDouble);
  at::Tensor grad = at::ones({3}, at::kFloat);
  grad.set_requires_grad(true);
  std::vector<c10::IValue> cases = {
      c10::IValue(at::Tensor()),
      c10::IValue(at::ones({2})),
      c10::IValue(at::ones({}, at::kLong)),
      c10::IValue(at::empty({0, 3})),
      c10::IValue(base),
      c10::IValue(base.transpose(0, 2)),
      c10::IValue(base.select(1, 2)),  // an offset and a stride
      c10::IValue(at::ones({3}).expand({4, 3})),  // a zero stride
      c10::IValue(large.slice(0, 1000, 1003)),  // compacted: a clone
      c10::IValue(grad),
      c10::IValue(grad.mul(2)),  // a history, detached
      c10::IValue(Tuple::create({base, base.select(0, 1), base})),  // shared
      c10::IValue(Tuple::create({large.slice(0, 0, 10), large})),
      c10::IValue(Tuple::create(
          {large.slice(0, 0, 10), large.slice(0, 0, 10)})),  // one clone
  };
  for (c10::ScalarType dtype :
       {at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf,
        at::kFloat, at::kDouble, at::kComplexFloat, at::kComplexDouble,
        at::kBool, at::kBFloat16}) {
    cases.push_back(c10::IValue(at::ones({2, 2}, dtype)));
  }
  for (const c10::IValue& v : cases) expect_as_through_messages(v);
}

TEST(CodecPlain, AutogradMetadataIsProtobufsBytes) {
  const c10::IValue value(at::ones({2}));
  for (ContextMeta meta :
       {ContextMeta{0, 0, 0}, ContextMeta{1, 2, 3},
        ContextMeta{int64_t{1} << 40, int64_t{1} << 50, -1},
        ContextMeta{7, -5, std::numeric_limits<int32_t>::min()}}) {
    expect_as_through_messages(value, &meta);
  }
  ContextMeta outside;  // no context: nothing travels
  expect_as_through_messages(value, &outside);
}

TEST(CodecPlain, ValuesItDoesNotWriteStillEncodeAsBefore) {
  // Mixed with plain values, the other kinds go through the messages.
  c10::impl::GenericList list(c10::IntType::get());
  list.push_back(int64_t{1});
  c10::IValue mixed = c10::ivalue::Tuple::create(
      {c10::IValue(at::ones({2})), c10::IValue(list),
       c10::IValue(at::ones({2}, at::kComplexFloat).conj())});
  expect_as_through_messages(mixed);
  // Dicts of other key or value types than keyword arguments'.
  c10::impl::GenericDict int_keys(c10::IntType::get(), c10::AnyType::get());
  int_keys.insert(int64_t{1}, c10::IValue(at::ones({2})));
  expect_as_through_messages(c10::IValue(int_keys));
  c10::impl::GenericDict str_to_int(c10::StringType::get(),
                                    c10::IntType::get());
  str_to_int.insert(std::string("a"), int64_t{1});
  expect_as_through_messages(c10::IValue(str_to_int));
  // A tuple deeper than the limit is refused as before, naming the limit.
  Limits shallow;
  shallow.max_depth = 1;
  c10::IValue two_deep =
      c10::ivalue::Tuple::create({c10::ivalue::Tuple::create({})});
  Message message;
  EXPECT_THAT(encode(two_deep, message, nullptr, nullptr, shallow),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_depth")));
  expect_as_through_messages(c10::ivalue::Tuple::create({}), nullptr,
                             shallow);
}

// decode() reads plain values without protobuf's messages: what it accepts
// must decode to the value the messages' decoder makes of the same bytes,
// and whatever it declines goes to that decoder (the same error). Results
// are compared as the messages' encoder writes them.
std::string as_reference_bytes(const absl::StatusOr<c10::IValue>& v) {
  if (!v.ok()) return v.status().ToString();
  Message m;
  absl::Status s = internal::encode_through_messages(*v, m);
  if (!s.ok()) return "not re-encodable: " + s.ToString();
  std::string out = absl::CHexEscape(m.payload);
  for (const c10::Storage& storage : m.storages) {
    absl::StrAppend(&out, " storage@", reinterpret_cast<uintptr_t>(storage.data()),
                    "+", storage.nbytes());
  }
  return out;
}

void expect_decoded_as_through_messages(const Message& message,
                                        const Limits& limits = Limits()) {
  ContextMeta direct_meta{11, 12, 13};
  ContextMeta reference_meta{11, 12, 13};
  absl::StatusOr<c10::IValue> direct =
      decode(message, limits, nullptr, &direct_meta);
  absl::StatusOr<c10::IValue> reference = internal::decode_through_messages(
      message, limits, nullptr, &reference_meta);
  ASSERT_EQ(as_reference_bytes(direct), as_reference_bytes(reference));
  EXPECT_EQ(direct_meta.context_id, reference_meta.context_id);
  EXPECT_EQ(direct_meta.message_id, reference_meta.message_id);
  EXPECT_EQ(direct_meta.from, reference_meta.from);
}

std::vector<Message> plain_messages() {
  using c10::ivalue::Tuple;
  const at::Tensor base = at::arange(24, at::kFloat).reshape({2, 3, 4});
  at::Tensor grad = at::ones({3}, at::kFloat);
  grad.set_requires_grad(true);
  std::vector<c10::IValue> values = {
      c10::IValue(),
      c10::IValue(true),
      c10::IValue(int64_t{-7}),
      c10::IValue(std::numeric_limits<int64_t>::min()),
      c10::IValue(2.5),
      c10::IValue(std::string(200, 's')),
      c10::IValue(at::Tensor()),
      c10::IValue(at::ones({}, at::kLong)),
      c10::IValue(base.transpose(0, 2)),
      c10::IValue(base.select(1, 2)),
      c10::IValue(grad),
      Tuple::create({}),
      Tuple::create({c10::IValue(std::string("aten::add.Scalar")),
                     Tuple::create({c10::IValue(at::ones({2})), 1.0}),
                     c10::IValue()}),
      Tuple::create({base, base.select(0, 1), Tuple::create({base, false})}),
      kwargs_of({}),
      Tuple::create({c10::IValue(std::string("f")), Tuple::create({}),
                     kwargs_of({{"a", c10::IValue(int64_t{1})},
                                {"bb", c10::IValue(base)},
                                {"c", kwargs_of({{"d", c10::IValue()}})}})}),
  };
  std::vector<Message> out;
  for (const c10::IValue& v : values) {
    for (const ContextMeta& meta :
         {ContextMeta{}, ContextMeta{0, -1, 0}, ContextMeta{5, 6, 7}}) {
      Message m;
      EXPECT_THAT(encode(v, m, nullptr, &meta), IsOk());
      out.push_back(std::move(m));
    }
  }
  return out;
}

TEST(CodecPlain, DecodesAsThroughMessages) {
  for (const Message& m : plain_messages()) {
    expect_decoded_as_through_messages(m);
    // Each limit tight, so that some messages are over one of them alone.
    Limits shallow;
    shallow.max_depth = 1;
    expect_decoded_as_through_messages(m, shallow);
    for (int64_t values = 1; values <= 7; ++values) {
      Limits few;
      few.max_values = values;
      expect_decoded_as_through_messages(m, few);
    }
    Limits flat;
    flat.max_tensor_dims = 2;
    expect_decoded_as_through_messages(m, flat);
  }
}

TEST(CodecPlain, MutatedPlainMessagesDecodeAsThroughMessages) {
  // Every byte of every message changed, and each message cut short at
  // every length: the direct reader accepts only what the messages'
  // decoder decodes to the same value, and leaves it every error.
  std::mt19937 rng(7);
  int64_t accepted = 0;
  for (const Message& original : plain_messages()) {
    for (size_t i = 0; i < original.payload.size(); ++i) {
      for (int trial = 0; trial < 4; ++trial) {
        Message m = original;
        m.payload[i] = static_cast<char>(
            trial == 0 ? m.payload[i] ^ 0x80 : rng() & 0xff);
        expect_decoded_as_through_messages(m);
        if (decode(m).ok()) ++accepted;
      }
      Message cut = original;
      cut.payload.resize(i);
      expect_decoded_as_through_messages(cut);
    }
    Message fewer = original;
    if (!fewer.storages.empty()) {
      fewer.storages.pop_back();
      expect_decoded_as_through_messages(fewer);
    }
    Message longer = original;
    longer.payload.push_back('\0');
    expect_decoded_as_through_messages(longer);
  }
  // Mutations that still decode exist (a changed int, a string's byte): the
  // comparison above covered successes, not only errors.
  EXPECT_GT(accepted, 100);
}

TEST(CodecEncode, RejectsUnsupportedKinds) {
  expect_unsupported(c10::IValue(c10::make_intrusive<c10::ivalue::Future>(
                         c10::IntType::get())),
                     "Future");
  expect_unsupported(c10::IValue(float_range(2).storage()), "Storage");
  auto cls = c10::ClassType::create("__torch__.Foo", {});
  expect_unsupported(c10::IValue(c10::ivalue::Object::create(
                         c10::StrongTypePtr(nullptr, cls), 0)),
                     "Object");
  expect_unsupported(
      tuple_of(
          {int64_t{1}, c10::IValue(c10::make_intrusive<c10::ivalue::Future>(
                           c10::IntType::get()))}),
      "root[1]: unsupported IValue kind Future");
  expect_unsupported(
      at::quantize_per_tensor(float_range(4), 0.1, 0, at::kQUInt8),
      "quantized");
  expect_unsupported(float_range(4).reshape({2, 2}).to_sparse_csr(),
                     "SparseCsr");
  expect_unsupported(at::empty({2}, at::TensorOptions().device(at::kMeta)),
                     "meta");
  expect_unsupported(c10::Device(c10::kCUDA, 0), "cuda");
  expect_unsupported(c10::impl::GenericList(c10::NumberType::get()),
                     "unsupported type");
}

TEST(CodecEncode, RejectsSelfContainingList) {
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(list);
  Message message;
  EXPECT_THAT(encode(list, message),
              StatusIs(absl::StatusCode::kResourceExhausted));
  list.clear();  // Break the cycle.
}

// --- rejections on decode ----------------------------------------------------

TEST(CodecDecode, EveryTruncationFails) {
  Message message = encoded(rich_value());
  ASSERT_THAT(decode(message), IsOk());
  const std::string full = message.payload;
  for (size_t n = 0; n < full.size(); ++n) {
    message.payload = full.substr(0, n);
    EXPECT_FALSE(decode(message).ok()) << "prefix of " << n << " bytes";
  }
}

// If garbage decodes at all, what it decodes to must encode and decode again.
void check_garbage(const Message& message) {
  absl::StatusOr<c10::IValue> decoded = decode(message);
  if (!decoded.ok()) {
    EXPECT_THAT(decoded.status().code(),
                ::testing::AnyOf(absl::StatusCode::kInvalidArgument,
                                 absl::StatusCode::kResourceExhausted));
    return;
  }
  Message again;
  ASSERT_THAT(encode(*decoded, again), IsOk());
  EXPECT_THAT(decode(again), IsOk());
}

TEST(CodecDecode, RandomGarbageNeverCrashes) {
  std::mt19937 rng(12345);
  for (int i = 0; i < 4000; ++i) {
    Message message;
    message.payload.resize(rng() % 128);
    for (char& c : message.payload) c = static_cast<char>(rng());
    for (uint32_t s = rng() % 3; s > 0; --s) {
      message.storages.push_back(
          at::empty({static_cast<int64_t>(rng() % 64)}, at::kByte).storage());
    }
    check_garbage(message);
  }
}

TEST(CodecDecode, MutatedPayloadsNeverCrash) {
  const Message valid = encoded(rich_value());
  std::mt19937 rng(777);
  for (int i = 0; i < 4000; ++i) {
    Message message = valid;
    for (uint32_t flips = 1 + rng() % 4; flips > 0; --flips) {
      message.payload[rng() % message.payload.size()] =
          static_cast<char>(rng());
    }
    check_garbage(message);
  }
}

c10::IValue nested_int_lists(int depth) {
  c10::impl::GenericList list(c10::IntType::get());
  list.push_back(int64_t{1});
  c10::IValue value = list;
  for (int i = 1; i < depth; ++i) {
    c10::impl::GenericList outer(
        c10::ListType::create(value.toList().elementType()));
    outer.push_back(value);
    value = outer;
  }
  return value;
}

TEST(CodecDecode, DepthOverLimitIsResourceExhausted) {
  const int max = Limits().max_depth;
  EXPECT_THAT(decode(encoded(nested_int_lists(max))), IsOk());
  EXPECT_THAT(decode(encoded(nested_int_lists(max + 1))),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("deeper than 64")));

  c10::IValue tuples = int64_t{1};
  for (int i = 0; i < 6; ++i) tuples = tuple_of({tuples});
  Limits limits;
  limits.max_depth = 5;
  EXPECT_THAT(decode(encoded(tuples), limits),
              StatusIs(absl::StatusCode::kResourceExhausted));
  limits.max_depth = 6;
  EXPECT_THAT(decode(encoded(tuples), limits), IsOk());
}

// Nesting is one limit, Limits::max_depth, counted the same way by encode
// and decode: a value either side takes at max_depth, and one level more is
// RESOURCE_EXHAUSTED naming the limit on both sides; what a sender with a
// larger limit sends to a stricter receiver (200 deep to 64) is
// RESOURCE_EXHAUSTED too, never INVALID_ARGUMENT.
TEST(CodecLimits, EncodeAndDecodeRefuseTheSameDepthWithTheSameCode) {
  auto nested = [](const std::string& kind, int depth) {
    c10::IValue v = int64_t{1};
    if (kind == "list") return nested_int_lists(depth);
    for (int i = 0; i < depth; ++i) {
      if (kind == "tuple") {
        v = tuple_of({v});
      } else {
        c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
        d.insert(std::string("k"), v);
        v = d;
      }
    }
    return v;
  };
  Limits widest;
  widest.max_depth = kMaxSupportedDepth;
  for (const std::string kind : {"list", "tuple", "dict"}) {
    for (int max : {8, 64, kMaxSupportedDepth}) {
      SCOPED_TRACE(absl::StrCat(kind, " with max_depth ", max));
      Limits limits;
      limits.max_depth = max;
      const std::string why = absl::StrCat("nested deeper than ", max);
      Message at_limit;
      ASSERT_THAT(encode(nested(kind, max), at_limit, nullptr, nullptr, limits),
                  IsOk());
      EXPECT_THAT(decode(at_limit, limits), IsOk());
      Message over;
      EXPECT_THAT(
          encode(nested(kind, max + 1), over, nullptr, nullptr, limits),
          StatusIs(absl::StatusCode::kResourceExhausted,
                   AllOf(HasSubstr(why), HasSubstr("max_depth"))));
      if (max == kMaxSupportedDepth) continue;
      for (int depth : {max + 1, 200, kMaxSupportedDepth}) {
        SCOPED_TRACE(absl::StrCat("sent ", depth, " deep"));
        Message sent;
        ASSERT_THAT(encode(nested(kind, depth), sent, nullptr, nullptr, widest),
                    IsOk());
        EXPECT_THAT(decode(sent, limits),
                    StatusIs(absl::StatusCode::kResourceExhausted,
                             AllOf(HasSubstr(why), HasSubstr("max_depth"))));
      }
    }
  }
  // A value deeper than the codec supports at all (a cycle, say) is refused
  // by encode whatever the limits say.
  Limits beyond;
  beyond.max_depth = 100000;
  Message message;
  EXPECT_THAT(encode(nested("tuple", 10000), message, nullptr, nullptr, beyond),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("nested deeper than 256")));
}

TEST(CodecDecode, TypeDepthOverLimitIsResourceExhausted) {
  Message message = encoded(c10::List<int64_t>());
  Envelope envelope = envelope_of(message);
  TypeDesc* type = envelope.mutable_root()->mutable_list()->mutable_elem_type();
  for (int i = 0; i < 100; ++i) {
    type->set_kind(TypeDesc::KIND_LIST);
    type = type->add_contained();
  }
  type->set_kind(TypeDesc::KIND_INT);
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message), StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(CodecDecode, ExtremeNestingIsRejectedWithoutOverflowingTheStack) {
  Envelope envelope;
  envelope.set_version(1);
  Value* value = envelope.mutable_root();
  for (int i = 0; i < 5000; ++i) value = value->mutable_tuple()->add_elems();
  value->mutable_none();
  Message message;
  set_envelope(message, envelope);
  EXPECT_FALSE(decode(message).ok());
}

TEST(CodecDecode, OtherLimitsAreResourceExhausted) {
  Message ints = encoded(c10::List<int64_t>(std::vector<int64_t>(100, 1)));
  Limits limits;
  limits.max_values = 50;
  EXPECT_THAT(decode(ints, limits),
              StatusIs(absl::StatusCode::kResourceExhausted));

  limits = Limits();
  limits.max_payload_bytes = 10;
  EXPECT_THAT(decode(ints, limits),
              StatusIs(absl::StatusCode::kResourceExhausted));

  Message two = encoded(tuple_of({float_range(1), float_range(2)}));
  limits = Limits();
  limits.max_storages = 1;
  EXPECT_THAT(decode(two, limits),
              StatusIs(absl::StatusCode::kResourceExhausted));

  Message dims = encoded(at::zeros({1, 1, 1, 1, 1}));
  limits = Limits();
  limits.max_tensor_dims = 4;
  EXPECT_THAT(
      decode(dims, limits),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("5 dims")));
}

// A message holding tuple(1, tensor); `edit` changes the tensor's metadata.
template <typename Edit>
absl::StatusOr<c10::IValue> decode_edited_tensor(
    Edit edit, const at::Tensor& tensor = float_range(6)) {
  Message message = encoded(tuple_of({int64_t{1}, tensor}));
  Envelope envelope = envelope_of(message);
  edit(*envelope.mutable_root()
            ->mutable_tuple()
            ->mutable_elems(1)
            ->mutable_tensor());
  set_envelope(message, envelope);
  return decode(message);
}

TEST(CodecDecode, RejectsBadTensorMetadata) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(decode_edited_tensor([](Tensor&) {}), IsOk());
  EXPECT_THAT(
      decode_edited_tensor([](Tensor& t) { t.set_storage_index(3); }),
      StatusIs(kInvalid,
               HasSubstr("tensor at root[1]: storage index 3 out of range "
                         "(1 storages)")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.set_sizes(0, 7); }),
              StatusIs(kInvalid, HasSubstr("needs 28 bytes")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.set_storage_offset(1); }),
              StatusIs(kInvalid, HasSubstr("which holds 24")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.set_strides(0, 2); }),
              StatusIs(kInvalid, HasSubstr("needs")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.set_sizes(0, -1); }),
              StatusIs(kInvalid, HasSubstr("negative size")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.set_strides(0, -1); }),
              StatusIs(kInvalid, HasSubstr("negative stride")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.set_storage_offset(-1); }),
              StatusIs(kInvalid, HasSubstr("negative storage offset")));
  EXPECT_THAT(decode_edited_tensor(
                  [](Tensor& t) { t.set_dtype(static_cast<DType>(99)); }),
              StatusIs(kInvalid, HasSubstr("unknown dtype 99")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.add_sizes(1); }),
              StatusIs(kInvalid, HasSubstr("2 sizes but 1 strides")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) {
                t.set_dtype(DTYPE_INT64);
                t.set_sizes(0, 3);
                t.set_requires_grad(true);
              }),
              StatusIs(kInvalid, HasSubstr("requires_grad")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) { t.set_defined(false); }),
              StatusIs(kInvalid, HasSubstr("undefined tensor with metadata")));
  // A huge element count with zero strides spans one element but overflows.
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) {
                t.set_sizes(0, int64_t{1} << 40);
                t.set_strides(0, 0);
                t.add_sizes(int64_t{1} << 40);
                t.add_strides(0);
              }),
              StatusIs(kInvalid, HasSubstr("overflow")));
  EXPECT_THAT(decode_edited_tensor([](Tensor& t) {
                t.set_storage_offset(std::numeric_limits<int64_t>::max());
              }),
              StatusIs(kInvalid, HasSubstr("overflow")));
}

// A message holding tuple(1, sparse 3x2 tensor with indices (0,1) (2,0),
// coalesced); `edit` changes the sparse tensor's metadata.
template <typename Edit>
absl::StatusOr<c10::IValue> decode_edited_sparse(Edit edit) {
  return decode_edited_tensor(
      edit, sparse({0, 2, 1, 0}, 2, float_range(2), {3, 2}).coalesce());
}

TEST(CodecDecode, RejectsBadSparseTensors) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(decode_edited_sparse([](Tensor&) {}), IsOk());
  // Index 2 of element 1 is past a dim 0 shrunk to size 2.
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) { t.set_sizes(0, 2); }),
              StatusIs(kInvalid, HasSubstr("sparse tensor at root[1]: index 2 "
                                           "of element 1 out of range for "
                                           "dim 0 of size 2")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) { t.set_sizes(1, -1); }),
              StatusIs(kInvalid, HasSubstr("negative size -1 in dim 1")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) { t.add_sizes(4); }),
              StatusIs(kInvalid, HasSubstr("2 sparse and 0 dense dims for a "
                                           "3-dim tensor")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) { t.add_strides(1); }),
              StatusIs(kInvalid, HasSubstr("strides")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) { t.set_storage_index(1); }),
              StatusIs(kInvalid, HasSubstr("storage index")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) {
                t.mutable_sparse_coo()->clear_values();
              }),
              StatusIs(kInvalid, HasSubstr("no indices or no values")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) {
                SparseCoo copy = t.sparse_coo();
                Tensor* indices = t.mutable_sparse_coo()->mutable_indices();
                *indices->mutable_sparse_coo() = copy;
              }),
              StatusIs(kInvalid, HasSubstr("sparse themselves")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) {
                t.mutable_sparse_coo()->mutable_indices()->set_dtype(
                    DTYPE_FLOAT64);
              }),
              StatusIs(kInvalid, HasSubstr("2-dim int64")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) {
                t.mutable_sparse_coo()->mutable_values()->set_requires_grad(
                    true);
              }),
              StatusIs(kInvalid, HasSubstr("require grad themselves")));
  EXPECT_THAT(
      decode_edited_sparse([](Tensor& t) { t.set_dtype(DTYPE_FLOAT64); }),
      StatusIs(kInvalid, HasSubstr("values are Float, the tensor is Double")));
  // One index left for two values.
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) {
                Tensor* i = t.mutable_sparse_coo()->mutable_indices();
                i->set_sizes(1, 1);
              }),
              StatusIs(kInvalid, HasSubstr("1 indices but values of shape")));
  // A stride of 0 along the elements: element 1 repeats element 0.
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) {
                t.mutable_sparse_coo()->mutable_indices()->set_strides(1, 0);
              }),
              StatusIs(kInvalid, HasSubstr("said coalesced but element 1 is "
                                           "not after element 0")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) {
                t.set_dtype(DTYPE_INT32);
                t.mutable_sparse_coo()->mutable_values()->set_dtype(
                    DTYPE_INT32);
                t.set_requires_grad(true);
              }),
              StatusIs(kInvalid, HasSubstr("requires_grad on a Int")));
  EXPECT_THAT(decode_edited_sparse([](Tensor& t) { t.set_defined(false); }),
              StatusIs(kInvalid, HasSubstr("undefined tensor with metadata")));
}

TEST(CodecDecode, RejectsNullStorage) {
  Message message = encoded(float_range(2));
  message.storages[0] = c10::Storage();
  EXPECT_THAT(decode(message), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("is null")));
}

TEST(CodecDecode, RejectsBadTypesAndContainers) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  Message list_message = encoded(c10::List<std::string>({"a"}));
  auto edit_list = [&](auto edit) {
    Message message = list_message;
    Envelope envelope = envelope_of(message);
    edit(*envelope.mutable_root()->mutable_list());
    set_envelope(message, envelope);
    return decode(message);
  };
  EXPECT_THAT(edit_list([](List&) {}), IsOk());
  EXPECT_THAT(
      edit_list([](List& l) {
        l.mutable_elem_type()->set_kind(static_cast<TypeDesc::Kind>(99));
      }),
      StatusIs(kInvalid, HasSubstr("unknown type kind 99")));
  EXPECT_THAT(edit_list([](List& l) { l.clear_elem_type(); }),
              StatusIs(kInvalid, HasSubstr("no element type")));
  EXPECT_THAT(edit_list([](List& l) { l.add_elems()->set_int_value(3); }),
              StatusIs(kInvalid, HasSubstr("root[1]: a Int in a list of str")));
  EXPECT_THAT(edit_list([](List& l) { l.add_ints(3); }),
              StatusIs(kInvalid, HasSubstr("wrong field")));
  EXPECT_THAT(
      edit_list([](List& l) {
        l.mutable_elem_type()->add_contained()->set_kind(TypeDesc::KIND_INT);
      }),
      StatusIs(kInvalid, HasSubstr("contained types")));
  EXPECT_THAT(edit_list([](List& l) {
                TypeDesc* t = l.mutable_elem_type();
                t->set_kind(TypeDesc::KIND_OPTIONAL);
                t->add_contained()->set_kind(TypeDesc::KIND_NONE);
              }),
              StatusIs(kInvalid, HasSubstr("Optional[None]")));
  EXPECT_THAT(edit_list([](List& l) { l.add_elems(); }),
              StatusIs(kInvalid, HasSubstr("root[1]: no kind set")));

  c10::Dict<int64_t, double> dict;
  dict.insert(1, 1.0);
  dict.insert(2, 2.0);
  Message dict_message = encoded(dict);
  auto edit_dict = [&](auto edit) {
    Message message = dict_message;
    Envelope envelope = envelope_of(message);
    edit(*envelope.mutable_root()->mutable_dict());
    set_envelope(message, envelope);
    return decode(message);
  };
  EXPECT_THAT(edit_dict([](Dict&) {}), IsOk());
  EXPECT_THAT(edit_dict([](Dict& d) {
                d.mutable_entries(1)->mutable_key()->set_int_value(1);
              }),
              StatusIs(kInvalid, HasSubstr("duplicate key")));
  EXPECT_THAT(edit_dict([](Dict& d) {
                d.mutable_entries(1)->mutable_value()->set_bool_value(true);
              }),
              StatusIs(kInvalid, HasSubstr("root[2]: a Bool")));
  EXPECT_THAT(edit_dict([](Dict& d) {
                TypeDesc* key = d.mutable_key_type();
                key->set_kind(TypeDesc::KIND_LIST);
                key->add_contained()->set_kind(TypeDesc::KIND_INT);
              }),
              StatusIs(kInvalid, HasSubstr("unsupported key type List[int]")));
  EXPECT_THAT(edit_dict([](Dict& d) {
                d.mutable_key_type()->set_kind(TypeDesc::KIND_ANY);
                TypeDesc* value_type = d.mutable_entries(0)
                                           ->mutable_key()
                                           ->mutable_list()
                                           ->mutable_elem_type();
                value_type->set_kind(TypeDesc::KIND_INT);
              }),
              StatusIs(kInvalid, HasSubstr("a GenericList in a dict keyed")));
  EXPECT_THAT(edit_dict([](Dict& d) { d.mutable_entries(0)->clear_value(); }),
              StatusIs(kInvalid, HasSubstr("no key or no value")));
}

TEST(CodecDecode, RejectsBadEnvelopes) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  Message message = encoded(float_range(2));
  Envelope good = envelope_of(message);

  Envelope envelope = good;
  envelope.set_version(2);
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message),
              StatusIs(kInvalid, HasSubstr("unsupported wire version 2")));

  envelope = good;
  envelope.set_storage_count(2);
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message), StatusIs(kInvalid, HasSubstr("announces 2")));

  envelope = good;
  envelope.clear_root();
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message), StatusIs(kInvalid, HasSubstr("no root")));

  envelope = good;
  envelope.mutable_root()
      ->mutable_tensor()
      ->GetReflection()
      ->MutableUnknownFields(envelope.mutable_root()->mutable_tensor())
      ->AddVarint(99, 1);
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message),
              StatusIs(kInvalid, HasSubstr("tensor at root: unknown fields")));

  envelope = good;
  envelope.mutable_root()->mutable_device()->set_kind(DEVICE_KIND_CPU);
  envelope.mutable_root()->mutable_device()->set_index(3);
  set_envelope(message, envelope);
  EXPECT_THAT(decode(message), StatusIs(kInvalid, HasSubstr("index 3")));

  message.payload.clear();
  EXPECT_THAT(decode(message), StatusIs(kInvalid));
}

TEST(CodecProfiled, WrappersKeepTheMessageAndCarryTheProfile) {
  Message inner;
  inner.type = MessageType::kCall;
  inner.id = 42;
  ASSERT_THAT(encode(c10::IValue(at::ones({3})), inner), IsOk());
  const std::string payload = inner.payload;
  ProfilerSettings settings;
  settings.record_shapes = true;
  settings.profile_memory = true;
  absl::StatusOr<Message> request = wrap_profiled_request(inner, settings);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->type, MessageType::kProfiledRequest);
  EXPECT_EQ(request->id, 42);
  ASSERT_EQ(request->storages.size(), 1u);  // out of band, not copied
  EXPECT_TRUE(request->storages[0].is_alias_of(inner.storages[0]));

  ProfilerSettings read;
  absl::StatusOr<Message> unwrapped =
      unwrap_profiled_request(*request, read);
  ASSERT_THAT(unwrapped, IsOk());
  EXPECT_EQ(unwrapped->type, MessageType::kCall);
  EXPECT_EQ(unwrapped->id, 42);
  EXPECT_EQ(unwrapped->payload, payload);
  EXPECT_TRUE(read.record_shapes);
  EXPECT_TRUE(read.profile_memory);
  EXPECT_FALSE(read.with_stack);

  ProfiledEvent push;
  push.kind = 1;
  push.name = "aten::add";
  push.thread_id = 7;
  push.handle = 99;
  push.shapes = {{3}, {}};
  push.node_id = 2;
  push.cpu_memory_usage = 12;
  push.cpu_ns = 1000;
  absl::StatusOr<Message> response =
      wrap_profiled_response(*unwrapped, {push});
  ASSERT_THAT(response, IsOk());
  std::vector<ProfiledEvent> events;
  absl::StatusOr<Message> back = unwrap_profiled_response(*response, events);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->payload, payload);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "aten::add");
  EXPECT_EQ(events[0].shapes, push.shapes);
  EXPECT_EQ(events[0].node_id, 2);
  EXPECT_EQ(events[0].cpu_ns, 1000);
  EXPECT_EQ(events[0].handle, 99u);
}

TEST(CodecProfiled, BadWrappersAndEventsAreRefusedNamingWhatIsWrong) {
  std::vector<ProfiledEvent> events;
  Message garbage;
  garbage.payload = "\x0a\xff";
  EXPECT_THAT(unwrap_profiled_response(garbage, events),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("malformed PROFILED_RESPONSE")));
  ProfilerSettings settings;
  EXPECT_THAT(unwrap_profiled_request(garbage, settings),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("malformed PROFILED_REQUEST")));

  Message inner;
  inner.type = MessageType::kCallRet;
  auto refused = [&](ProfiledEvent e) {
    absl::StatusOr<Message> wrapped = wrap_profiled_response(inner, {e});
    EXPECT_THAT(wrapped, IsOk());
    return unwrap_profiled_response(*wrapped, events).status();
  };
  ProfiledEvent good;
  good.kind = 2;
  good.cpu_ns = 5;
  ProfiledEvent kind = good;
  kind.kind = 9;
  EXPECT_THAT(refused(kind), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("event 0 has the unknown "
                                                "kind 9")));
  ProfiledEvent time = good;
  time.cpu_ns = 0;
  EXPECT_THAT(refused(time), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("event 0 has the time 0 ns")));
  ProfiledEvent deep = good;
  deep.shapes = {std::vector<int64_t>(65, 1)};
  EXPECT_THAT(refused(deep),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a shape of 65 dimensions, over the limit "
                                 "max_tensor_dims")));
  ProfiledEvent node = good;
  node.node_id = -5;
  EXPECT_THAT(refused(node), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("names the worker -5")));

  // A wrapper of nothing (type 0) and one over the payload limit.
  Message untyped;
  absl::StatusOr<Message> wrapped = wrap_profiled_response(untyped, {});
  ASSERT_THAT(wrapped, IsOk());
  EXPECT_THAT(unwrap_profiled_response(*wrapped, events),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wraps a message of type 0")));
  Limits small;
  small.max_payload_bytes = 4;
  Message big;
  big.type = MessageType::kCall;
  big.payload = std::string(100, 'x');
  absl::StatusOr<Message> big_request =
      wrap_profiled_request(big, ProfilerSettings());
  ASSERT_THAT(big_request, IsOk());
  EXPECT_THAT(unwrap_profiled_request(*big_request, settings, small),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("over the limit of 4")));
}

}  // namespace
}  // namespace tether::wire
