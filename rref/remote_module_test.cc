// RemoteModule between two workers of one process over loopback: a
// torch::nn::Module made on another worker by its C++ type, forward through
// it, its parameters' RRefs trained by a DistributedOptimizer.
#include "rref/remote_module.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "autograd/autograd.h"
#include "autograd/autograd_testing.h"
#include "optim/optimizer.h"
#include "testing/loopback_group.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in, int64_t out)
      : fc(register_module("fc", torch::nn::Linear(in, out))) {}
  at::Tensor forward(const at::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};

struct Unregistered : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x; }
};

class RemoteModules : public testing::LoopbackGroup {
 protected:
  void SetUp() override {
    static const absl::Status registered =
        register_module<NetImpl, int64_t, int64_t>();
    ASSERT_THAT(registered, IsOk());
    start(testing::group_options("remote_module_test", 4), {"trainer", "ps"},
          {rref_extension(), autograd::autograd_extension()});
  }
  Worker& trainer() { return *workers_[0]; }
};

TEST_F(RemoteModules, ForwardAndParametersWithoutQualifiedNames) {
  absl::StatusOr<RemoteModule> net =
      RemoteModule::create<NetImpl>(trainer(), "ps", {4, 2});
  ASSERT_THAT(net, IsOk());
  EXPECT_EQ(net->owner().name, "ps");
  at::Tensor x = at::ones({3, 4});
  absl::StatusOr<at::Tensor> y = net->forward<at::Tensor>({x});
  ASSERT_THAT(y, IsOk());
  EXPECT_EQ(y->sizes(), (std::vector<int64_t>{3, 2}));
  absl::StatusOr<std::vector<RRef>> params = net->parameter_rrefs();
  ASSERT_THAT(params, IsOk());
  ASSERT_EQ(params->size(), 2u);  // fc.weight, fc.bias
  for (const RRef& p : *params) EXPECT_EQ(p.owner_name(), "ps");
  // forward(x) is x W^T + b with the module's own parameters.
  absl::StatusOr<c10::IValue> weight = (*params)[0].to_here();
  absl::StatusOr<c10::IValue> bias = (*params)[1].to_here();
  ASSERT_THAT(weight, IsOk());
  ASSERT_THAT(bias, IsOk());
  EXPECT_TRUE(at::allclose(
      *y, at::linear(x, weight->toTensor(), bias->toTensor()).detach()));

  EXPECT_THAT(net->forward({at::ones({3, 4}), 5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("ps"), HasSubstr("forward"),
                             HasSubstr("takes 1 positional arguments, got 2"))));
  EXPECT_THAT(net->forward({std::string("x")}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must be Tensor, got str")));
  absl::StatusOr<RemoteModule> unknown =
      RemoteModule::create<Unregistered>(trainer(), "ps", {});
  ASSERT_THAT(unknown, IsOk());
  EXPECT_THAT(unknown->module_rref().get_future().get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("Unregistered")));
  EXPECT_THAT(RemoteModule::create<NetImpl>(trainer(), "ps", {4}).value()
                  .forward({x}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("RRef creation failed")));
}

TEST_F(RemoteModules, DistributedOptimizerTrainsTheRemoteParameters) {
  absl::StatusOr<RemoteModule> net =
      RemoteModule::create<NetImpl>(trainer(), "ps", {4, 1});
  ASSERT_THAT(net, IsOk());
  absl::StatusOr<std::vector<RRef>> params = net->parameter_rrefs();
  ASSERT_THAT(params, IsOk());
  optim::Options options;
  options.lr = 0.1;
  absl::StatusOr<optim::DistributedOptimizer> opt =
      optim::DistributedOptimizer::create(trainer(), optim::Kind::kSGD,
                                          *params, options);
  ASSERT_THAT(opt, IsOk());
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor x = at::randn({16, 4}, gen);
  at::Tensor target = x.sum(1, /*keepdim=*/true);
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    absl::StatusOr<autograd::Context> context =
        autograd::Context::enter(trainer());
    ASSERT_THAT(context, IsOk());
    absl::StatusOr<at::Tensor> y = net->forward<at::Tensor>({x});
    ASSERT_THAT(y, IsOk());
    at::Tensor loss = (*y - target).pow(2).mean();
    losses.push_back(loss.item<double>());
    ASSERT_THAT(autograd::backward(trainer(), context->id(), {loss}), IsOk());
    ASSERT_THAT(opt->step(context->id()), IsOk());
  }
  EXPECT_LT(losses.back(), losses.front() / 4)
      << "first " << losses.front() << ", last " << losses.back();
}

// The module's RRef answers state_dict() and load_state_dict(state) on its
// owner, as a checkpoint calls them (tether/checkpoint.h).
TEST_F(RemoteModules, StateDictOnTheOwnerSavesAndRestoresTheModule) {
  absl::StatusOr<RemoteModule> net =
      RemoteModule::create<NetImpl>(trainer(), "ps", {3, 2});
  ASSERT_THAT(net, IsOk());
  absl::StatusOr<c10::IValue> state =
      net->module_rref().rpc_sync().call("state_dict", {});
  ASSERT_THAT(state, IsOk());
  ASSERT_TRUE(state->isGenericDict());
  c10::Dict<std::string, at::Tensor> saved =
      c10::impl::toTypedDict<std::string, at::Tensor>(state->toGenericDict());
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved.at("fc.weight").sizes(), (std::vector<int64_t>{2, 3}));
  const at::Tensor x = at::ones({1, 3});
  absl::StatusOr<at::Tensor> before = net->forward<at::Tensor>({x});
  ASSERT_THAT(before, IsOk());

  c10::Dict<std::string, at::Tensor> zeros;
  zeros.insert("fc.weight", at::zeros({2, 3}));
  zeros.insert("fc.bias", at::zeros({2}));
  ASSERT_THAT(
      net->module_rref().rpc_sync().call("load_state_dict", {zeros}), IsOk());
  absl::StatusOr<at::Tensor> cleared = net->forward<at::Tensor>({x});
  ASSERT_THAT(cleared, IsOk());
  EXPECT_TRUE(at::equal(*cleared, at::zeros({1, 2})));
  ASSERT_THAT(net->module_rref().rpc_sync().call("load_state_dict", {saved}),
              IsOk());
  absl::StatusOr<at::Tensor> restored = net->forward<at::Tensor>({x});
  ASSERT_THAT(restored, IsOk());
  EXPECT_TRUE(at::equal(*restored, *before));

  // Strict, as PyTorch's: a missing, a foreign and a misshapen tensor (a
  // method's error reaches a proxy's caller as UNKNOWN with its text).
  c10::Dict<std::string, at::Tensor> partial;
  partial.insert("fc.weight", at::zeros({2, 3}));
  EXPECT_THAT(
      net->module_rref().rpc_sync().call("load_state_dict", {partial}),
      StatusIs(absl::StatusCode::kUnknown,
               HasSubstr("the state has no 'fc.bias' for the module's [2]")));
  c10::Dict<std::string, at::Tensor> extra = zeros.copy();
  extra.insert("fc.scale", at::zeros({2}));
  EXPECT_THAT(net->module_rref().rpc_sync().call("load_state_dict", {extra}),
              StatusIs(absl::StatusCode::kUnknown,
                       HasSubstr("'fc.scale', which the module has not")));
  c10::Dict<std::string, at::Tensor> misshapen = zeros.copy();
  misshapen.insert_or_assign("fc.bias", at::zeros({3}));
  EXPECT_THAT(
      net->module_rref().rpc_sync().call("load_state_dict", {misshapen}),
      StatusIs(absl::StatusCode::kUnknown,
               HasSubstr("'fc.bias' is [3], the module's [2]")));
}

}  // namespace
}  // namespace tether
