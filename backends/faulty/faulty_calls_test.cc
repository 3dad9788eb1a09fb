// Calls and distributed autograd under failed, dropped and late messages:
// three workers in one process over the faulty backend wrapping each real
// backend in turn (the test parameter). Every fault ends in a clear error
// within its bound, and the next call works.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include "autograd/autograd.h"
#include "autograd/autograd_testing.h"
#include "backends/builtin.h"
#include "core/worker.h"
#include "rref/rref_testing.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

class FaultyCalls : public ::testing::TestWithParam<std::string> {
 protected:
  void start(absl::flat_hash_map<std::string, std::string> faults,
             absl::Duration default_timeout = absl::Seconds(20)) {
    static std::atomic<int> counter{0};
    BackendRegistry registry;
    ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
    RpcOptions options;
    options.backend = "faulty";
    options.init_method = absl::StrCat("memory://faulty_calls_", counter++);
    options.default_timeout = default_timeout;
    options.backend_settings = std::move(faults);
    options.backend_settings["faulty.inner"] = GetParam();
    workers_ = testing::start_autograd_workers(registry, options,
                                               {"a", "b", "c"});
    for (const auto& w : workers_) ASSERT_NE(w, nullptr);
  }

  void TearDown() override { testing::shutdown_workers(workers_); }

  absl::StatusOr<c10::IValue> add(absl::Duration timeout) {
    return workers_[0]->rpc_sync("b", "aten::add.Tensor",
                                 {at::ones({2}), at::ones({2})}, {}, timeout);
  }

  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_P(FaultyCalls, DelayedCallsAgainstShortTimeouts) {
  start({{"faulty.delay", "CALL:400"}});
  absl::Time begin = absl::Now();
  EXPECT_THAT(add(absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - begin, absl::Seconds(2));
  begin = absl::Now();
  EXPECT_THAT(add(absl::Seconds(10)), IsOk());
  EXPECT_GE(absl::Now() - begin, absl::Milliseconds(400));
}

TEST_P(FaultyCalls, DroppedAndFailedCallsEndClearlyAndTheNextWorks) {
  start({{"faulty.drop", "CALL:1"}, {"faulty.fail", "CALL:1"}});
  // A send uses up a fail first, then a drop.
  EXPECT_THAT(add(absl::Seconds(10)),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(add(absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(add(absl::Seconds(10)), IsOk());
}

TEST_P(FaultyCalls, DelayedBackwardMessagesStillGiveTheRightGradients) {
  start({{"faulty.delay", "AUTOGRAD_BACKWARD:150"}});
  at::Tensor x = at::arange(4, at::kFloat).requires_grad_(true);
  absl::StatusOr<autograd::Context> context =
      autograd::Context::enter(*workers_[0]);
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<c10::IValue> y = workers_[0]->rpc_sync(
      "b", testing::kMulVia, {std::string("c"), x, x});
  ASSERT_THAT(y, IsOk());
  ASSERT_THAT(autograd::backward(*workers_[0], context->id(),
                                 {y->toTensor().sum()}),
              IsOk());
  absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> grads =
      autograd::get_gradients(*workers_[0], context->id());
  ASSERT_THAT(grads, IsOk());
  // y = (2x) * x + x, dy/dx = 4x + 1.
  EXPECT_TRUE(at::allclose(grads->at(x), x.detach() * 4 + 1));
}

TEST_P(FaultyCalls, DroppedBackwardMessageFailsTheRootWithinTheTimeout) {
  start({{"faulty.drop", "AUTOGRAD_BACKWARD:1"}},
        /*default_timeout=*/absl::Milliseconds(500));
  at::Tensor x = at::arange(4, at::kFloat).requires_grad_(true);
  absl::StatusOr<autograd::Context> context =
      autograd::Context::enter(*workers_[0]);
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<c10::IValue> y = workers_[0]->rpc_sync(
      "b", "aten::mul.Tensor", {x, x}, {}, absl::Seconds(10));
  ASSERT_THAT(y, IsOk());
  const absl::Time begin = absl::Now();
  EXPECT_THAT(autograd::backward(*workers_[0], context->id(),
                                 {y->toTensor().sum()}),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("sending gradients to worker 1 (b)")));
  EXPECT_LT(absl::Now() - begin, absl::Seconds(5));
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultyCalls,
                         ::testing::Values("loopback", "tensorpipe", "grpc",
                                           "libfabric"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace tether
