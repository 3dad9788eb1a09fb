#include "core/callables.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "core/native_function.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

int64_t which_a(const at::Tensor&) { return 1; }
int64_t which_b(const at::Tensor&, int64_t) { return 2; }
int64_t which_scalar(const c10::Scalar&) { return 3; }
int64_t which_int(int64_t) { return 4; }

// Overloads that tie (a and b fit one tensor equally) and one that a plain
// int fits better than a Scalar does.
TORCH_LIBRARY(tether_callables_test, m) {
  m.def("which.a(Tensor x) -> int", &which_a);
  m.def("which.b(Tensor x, int y=0) -> int", &which_b);
  m.def("which.scalar(Scalar x) -> int", &which_scalar);
  m.def("which.int(int x) -> int", &which_int);
}

TEST(Callables, BareNamePicksTheOverloadThatFits) {
  Callables callables;
  at::Tensor t = at::ones({2});
  absl::StatusOr<c10::IValue> scalar = callables.call("aten::add", {t, 3}, {});
  ASSERT_THAT(scalar, IsOk());
  EXPECT_TRUE(scalar->toTensor().equal(at::full({2}, 4.0)));

  absl::StatusOr<c10::IValue> tensor = callables.call("aten::add", {t, t}, {});
  ASSERT_THAT(tensor, IsOk());
  EXPECT_TRUE(tensor->toTensor().equal(at::full({2}, 2.0)));

  absl::StatusOr<c10::IValue> alpha =
      callables.call("aten::add", {t, t}, {{"alpha", c10::IValue(int64_t{3})}});
  ASSERT_THAT(alpha, IsOk());
  EXPECT_TRUE(alpha->toTensor().equal(at::full({2}, 4.0)));

  absl::StatusOr<c10::IValue> relu =
      callables.call("aten::relu", {at::full({2}, -1.0)}, {});
  ASSERT_THAT(relu, IsOk());
  EXPECT_TRUE(relu->toTensor().equal(at::zeros({2})));
}

TEST(Callables, TupleFitsWhereAListIsDeclared) {
  // As Python's torch takes them: torch.stack((a, b)), t.sum((0, 1)).
  Callables callables;
  at::Tensor a = at::ones({2});
  absl::StatusOr<c10::IValue> stacked = callables.call(
      "aten::stack", {c10::ivalue::Tuple::create({a, a * 2})}, {});
  ASSERT_THAT(stacked, IsOk());
  EXPECT_TRUE(stacked->toTensor().equal(at::stack({a, a * 2})));
  absl::StatusOr<c10::IValue> summed = callables.call(
      "aten::sum",
      {at::ones({2, 3}), c10::ivalue::Tuple::create({int64_t{0}, int64_t{1}})},
      {});
  ASSERT_THAT(summed, IsOk());
  EXPECT_EQ(summed->toTensor().item<double>(), 6.0);
  // An element that fits no list of the declared type is still refused.
  absl::StatusOr<c10::IValue> mixed = callables.call(
      "aten::stack", {c10::ivalue::Tuple::create({a, c10::IValue("x")})}, {});
  EXPECT_THAT(mixed.status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Callables, ExactConversionBeatsAScalar) {
  Callables callables;
  absl::StatusOr<c10::IValue> by_int =
      callables.call("tether_callables_test::which", {int64_t{7}}, {});
  ASSERT_THAT(by_int, IsOk());
  EXPECT_EQ(by_int->toInt(), 4);
  absl::StatusOr<c10::IValue> by_float =
      callables.call("tether_callables_test::which", {2.5}, {});
  ASSERT_THAT(by_float, IsOk());
  EXPECT_EQ(by_float->toInt(), 3);
  absl::StatusOr<c10::IValue> by_position =
      callables.call("tether_callables_test::which", {at::ones({1}), 1}, {});
  ASSERT_THAT(by_position, IsOk());
  EXPECT_EQ(by_position->toInt(), 2);
}

TEST(Callables, AmbiguousBareNameListsTheTiedOverloads) {
  Callables callables;
  absl::StatusOr<c10::IValue> tied =
      callables.call("tether_callables_test::which", {at::ones({1})}, {});
  EXPECT_THAT(tied.status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(tied.status().message()),
              AllOf(HasSubstr("fit several overloads"),
                    HasSubstr("tether_callables_test::which.a(Tensor x)"),
                    HasSubstr("tether_callables_test::which.b(Tensor x, int "
                              "y=0)")));
}

TEST(Callables, UnmatchedBareNameListsTheCandidates) {
  Callables callables;
  absl::StatusOr<c10::IValue> r =
      callables.call("aten::add", {c10::IValue("text")}, {});
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(StartsWith("Overloaded torch operator invoked from "
                               "Python failed to many any schema: "),
                    HasSubstr("no overload of aten::add fits the arguments "
                              "(str)"),
                    HasSubstr("aten::add.Tensor(Tensor self, Tensor other"),
                    HasSubstr("aten::add.Scalar(Tensor self, Scalar other")));
}

TEST(Callables, FullNameWithBadArgumentsShowsTheSchema) {
  Callables callables;
  absl::StatusOr<c10::IValue> r =
      callables.call("aten::add.Tensor", {at::ones({1}), 3}, {});
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("argument 'other' (position 1) must be Tensor, "
                              "got int"),
                    HasSubstr("its schema is aten::add.Tensor(")));
  absl::StatusOr<c10::IValue> unknown = callables.call(
      "aten::add.Tensor", {at::ones({1}), at::ones({1})},
      {{"beta", c10::IValue(int64_t{1})}});
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unexpected keyword argument 'beta'"));
  absl::StatusOr<c10::IValue> twice = callables.call(
      "aten::add.Tensor", {at::ones({1}), at::ones({1})},
      {{"self", c10::IValue(at::ones({1}))}});
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("argument 'self' given by position and keyword"));
}

TEST(Callables, UnknownNameIsNotFound) {
  Callables callables;
  EXPECT_THAT(callables.call("aten::no_such_op", {}, {}).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(callables.call("nowhere", {}, {}).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(Callables, OperatorsThatReadFilesAreRefused) {
  const std::string path = ::testing::TempDir() + "/callables_secret";
  {
    std::ofstream out(path, std::ios::binary);
    out << "secret!!";
  }
  Callables callables;
  for (const char* name : {"aten::from_file", "aten::from_file.out"}) {
    absl::StatusOr<c10::IValue> r = callables.call(
        name, {c10::IValue(path), c10::IValue(false), c10::IValue(int64_t{8})},
        {{"dtype", c10::IValue(int64_t{static_cast<int>(at::kByte)})}});
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kPermissionDenied))
        << name;
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("reads or writes the callee's files"));
  }
  std::remove(path.c_str());
}

class Echo : public CallableProvider {
 public:
  absl::StatusOr<c10::IValue> call(absl::string_view name,
                                   std::vector<c10::IValue> args,
                                   const Kwargs&) override {
    return c10::ivalue::Tuple::create(
        {c10::IValue(std::string(name)), c10::IValue(int64_t(args.size()))});
  }
};

TEST(Callables, ProviderServesItsPrefix) {
  Callables callables;
  ASSERT_THAT(callables.add_provider("echo::", std::make_shared<Echo>()),
              IsOk());
  EXPECT_THAT(callables.add_provider("echo::", std::make_shared<Echo>()),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(callables.add_provider("echo", std::make_shared<Echo>()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  absl::StatusOr<c10::IValue> r =
      callables.call("echo::mod:fn", {1, 2}, {});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->toTupleRef().elements()[0].toStringRef(), "echo::mod:fn");
  EXPECT_EQ(r->toTupleRef().elements()[1].toInt(), 2);
}

TEST(Callables, PrimOperatorsAndPythonBuiltins) {
  Callables callables;
  absl::StatusOr<c10::IValue> min = callables.call("prim::min", {1, 2}, {});
  ASSERT_THAT(min, IsOk());
  EXPECT_EQ(min->toInt(), 1);
  // The peer's examples call the Python builtin: the same operator.
  absl::StatusOr<c10::IValue> builtin = callables.call("min", {1, 2}, {});
  ASSERT_THAT(builtin, IsOk());
  EXPECT_EQ(builtin->toInt(), 1);
  absl::StatusOr<c10::IValue> max = callables.call("max", {1, 2.5}, {});
  ASSERT_THAT(max, IsOk());
  EXPECT_EQ(max->toDouble(), 2.5);
  absl::StatusOr<c10::IValue> full =
      callables.call("prim::max.int", {int64_t{7}, int64_t{3}}, {});
  ASSERT_THAT(full, IsOk());
  EXPECT_EQ(full->toInt(), 7);
  absl::StatusOr<c10::IValue> sum =
      callables.call("sum", {std::vector<int64_t>{1, 2, 3}}, {});
  ASSERT_THAT(sum, IsOk());
  EXPECT_EQ(sum->toInt(), 6);
  absl::StatusOr<c10::IValue> len =
      callables.call("len", {std::vector<int64_t>{4, 5}}, {});
  ASSERT_THAT(len, IsOk());
  EXPECT_EQ(len->toInt(), 2);
  absl::StatusOr<c10::IValue> abs = callables.call("abs", {-3}, {});
  ASSERT_THAT(abs, IsOk());
  EXPECT_EQ(abs->toInt(), 3);
  // Tensors still reach the dispatcher's overloads of the same name.
  absl::StatusOr<c10::IValue> tensor_sum =
      callables.call("sum", {at::ones({3})}, {});
  ASSERT_THAT(tensor_sum, IsOk());
  EXPECT_EQ(tensor_sum->toTensor().item<double>(), 3.0);
  // Nothing fits: the candidates are listed.
  EXPECT_THAT(callables.call("min", {std::string("a")}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no overload of prim::min"),
                             HasSubstr("prim::min.int(int a, int b)"))));
}

TEST(Callables, TorchScriptOperatorsThatTouchFilesAreNotCallable) {
  Callables callables;
  const std::string path = ::testing::TempDir() + "/tether_saved";
  EXPECT_THAT(callables.call("aten::save", {at::ones({2}), path}, {}),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(callables.call("aten::save.default", {at::ones({2}), path}, {}),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(std::ifstream(path).good());
}

TEST(Callables, NativeFunctionsConvertAndCheckTheirArguments) {
  Callables callables;
  ASSERT_THAT(
      callables.add_function(
          "my_add", native_function([](at::Tensor a, const at::Tensor& b) {
            return a + b;
          })),
      IsOk());
  ASSERT_THAT(callables.add_function(
                  "myns::repeat",
                  native_function([](std::string s, int64_t n,
                                     std::vector<double> xs) {
                    std::string out;
                    for (int64_t i = 0; i < n; ++i) out += s;
                    return std::make_tuple(out, static_cast<int64_t>(xs.size()));
                  })),
              IsOk());
  absl::StatusOr<c10::IValue> sum =
      callables.call("my_add", {at::ones({2}), at::ones({2})}, {});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(sum->toTensor().equal(at::full({2}, 2.0)));
  absl::StatusOr<c10::IValue> repeated = callables.call(
      "myns::repeat", {std::string("ab"), 3, std::vector<double>{1.0, 2.0}},
      {});
  ASSERT_THAT(repeated, IsOk());
  EXPECT_EQ(repeated->toTupleRef().elements()[0].toStringRef(), "ababab");
  EXPECT_EQ(repeated->toTupleRef().elements()[1].toInt(), 2);

  EXPECT_THAT(callables.call("my_add", {at::ones({2}), 3}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("my_add"), HasSubstr("position 1"),
                             HasSubstr("must be Tensor, got int"),
                             HasSubstr("it takes (Tensor, Tensor)"))));
  EXPECT_THAT(callables.call("my_add", {at::ones({2})}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("missing argument")));
  EXPECT_THAT(
      callables.call("my_add", {at::ones({2}), at::ones({2}), at::ones({2})},
                     {}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("takes 2 positional arguments, got 3")));
}

TEST(Callables, NativeFunctionErrorsKeepTheirCode) {
  Callables callables;
  ASSERT_THAT(callables.add_function(
                  "checked", native_function([](int64_t x)
                                                 -> absl::StatusOr<int64_t> {
                    if (x < 0) return absl::OutOfRangeError("x is negative");
                    return x * 2;
                  })),
              IsOk());
  ASSERT_THAT(callables.add_function("throws", native_function([](int64_t) {
                                       throw std::runtime_error("boom");
                                     })),
              IsOk());
  absl::StatusOr<c10::IValue> doubled = callables.call("checked", {21}, {});
  ASSERT_THAT(doubled, IsOk());
  EXPECT_EQ(doubled->toInt(), 42);
  EXPECT_THAT(callables.call("checked", {-1}, {}),
              StatusIs(absl::StatusCode::kOutOfRange, "x is negative"));
  EXPECT_THAT(callables.call("throws", {1}, {}),
              StatusIs(absl::StatusCode::kUnknown, HasSubstr("boom")));
}

TEST(Callables, FunctionNamesAreCheckedWhenRegistered) {
  Callables callables;
  auto identity = native_function([](int64_t x) { return x; });
  EXPECT_THAT(callables.add_function("aten::add", identity),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("LibTorch operator or builtin")));
  EXPECT_THAT(callables.add_function("min", identity),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(callables.add_function("two words", identity),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two words")));
  EXPECT_THAT(callables.add_function("", identity),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(callables.add_function("mine", identity), IsOk());
  EXPECT_THAT(callables.add_function("mine", identity),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("mine")));
}

TEST(Callables, ProcessWideFunctionsServeEveryCallables) {
  ASSERT_THAT(register_function("callables_test::triple",
                                [](int64_t x) { return 3 * x; }),
              IsOk());
  EXPECT_THAT(register_function("callables_test::triple",
                                [](int64_t x) { return x; }),
              StatusIs(absl::StatusCode::kAlreadyExists));
  Callables one;
  Callables two;
  for (const Callables* callables : {&one, &two}) {
    absl::StatusOr<c10::IValue> tripled =
        callables->call("callables_test::triple", {5}, {});
    ASSERT_THAT(tripled, IsOk());
    EXPECT_EQ(tripled->toInt(), 15);
  }
}

TEST(Callables, UnknownNameExplainsTheAlwayslinkTrap) {
  Callables callables;
  EXPECT_THAT(callables.call("myns::not_linked", {}, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("myns::not_linked"),
                             HasSubstr("alwayslink = True"),
                             HasSubstr("register_function"))));
}

TEST(Callables, KeywordArgumentsTravelAsNoneOrADict) {
  EXPECT_TRUE(kwargs_to_wire({}).isNone());
  c10::IValue wire = kwargs_to_wire({{"alpha", c10::IValue(2)}});
  ASSERT_TRUE(wire.isGenericDict());
  EXPECT_TRUE(is_wire_kwargs(wire));
  EXPECT_TRUE(is_wire_kwargs(c10::IValue()));
  EXPECT_FALSE(is_wire_kwargs(c10::IValue(1)));

  absl::StatusOr<Kwargs> none = kwargs_from_wire(c10::IValue());
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->empty());
  absl::StatusOr<Kwargs> back = kwargs_from_wire(wire);
  ASSERT_THAT(back, IsOk());
  ASSERT_EQ(back->count("alpha"), 1u);
  EXPECT_EQ(back->at("alpha").toInt(), 2);

  c10::impl::GenericDict int_keys(c10::IntType::get(), c10::AnyType::get());
  int_keys.insert(c10::IValue(1), c10::IValue(2));
  EXPECT_THAT(kwargs_from_wire(c10::IValue(int_keys)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keyword argument names must be strings")));
  EXPECT_THAT(kwargs_from_wire(c10::IValue(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a dict or None")));
}

}  // namespace
}  // namespace tether
