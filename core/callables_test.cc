#include "core/callables.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

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
              AllOf(HasSubstr("no overload of aten::add fits the arguments "
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

}  // namespace
}  // namespace tether
