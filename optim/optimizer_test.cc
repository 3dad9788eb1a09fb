// DistributedOptimizer between three workers in one process over loopback:
// training over parameters on two owners against the same training done
// locally with torch::optim, errors, and saving and restoring state.
#include "optim/optimizer.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/optim.h>

#include <atomic>
#include <thread>

#include "autograd/autograd.h"
#include "autograd/autograd_testing.h"
#include "rref/rref_testing.h"
#include "testing/loopback_group.h"
#include "testing/status_matchers.h"

namespace tether::optim {
namespace {

// RRefs the trainer received, as users get them in a real program: an owner
// sends its RRef::local to the trainer, which keeps it (kept()).
absl::Mutex kept_mu;
std::vector<RRef>* kept_rrefs = new std::vector<RRef>;

void keep(const c10::IValue& r) {
  absl::StatusOr<RRef> rref = RRef::from_ivalue(r);
  TORCH_CHECK(rref.ok(), rref.status().ToString());
  absl::MutexLock lock(&kept_mu);
  kept_rrefs->push_back(*rref);
}

RRef take_kept() {
  absl::MutexLock lock(&kept_mu);
  RRef r = kept_rrefs->back();
  kept_rrefs->pop_back();
  return r;
}

TORCH_LIBRARY(tether_optim_test, m) { m.def("keep(Any r) -> ()", &keep); }

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

at::Tensor randn(std::vector<int64_t> sizes, int64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen);
}

// The loss of the test model: two parameter tensors on different owners.
at::Tensor loss_of(const at::Tensor& w1, const at::Tensor& w2,
                   const at::Tensor& input) {
  at::Tensor hidden = at::tanh(at::matmul(input, w1));
  return (at::matmul(hidden, w2) - 1.0).pow(2).mean();
}

class DistOptimizer : public testing::LoopbackGroup {
 protected:
  void SetUp() override {
    start(testing::group_options("optim_test"), {"trainer", "ps1", "ps2"},
          {rref_extension(), autograd::autograd_extension()});
  }

  Worker& trainer() { return *workers_[0]; }

  // A leaf owned by worker `rank`, and the trainer's RRef to it.
  std::pair<at::Tensor, RRef> param(int rank, at::Tensor value) {
    at::Tensor leaf = value.clone().requires_grad_(true);
    return {leaf, send_to_trainer(rank, leaf)};
  }

  RRef send_to_trainer(int rank, c10::IValue value) {
    absl::StatusOr<RRef> r = RRef::local(*workers_[rank], std::move(value));
    EXPECT_THAT(r, IsOk());
    EXPECT_THAT(workers_[rank]->rpc_sync("trainer", "tether_optim_test::keep",
                                         {r->to_ivalue()}),
                IsOk());
    return take_kept();
  }

  // One distributed training step: fetch the parameters in a context,
  // backward, step.
  absl::Status train_step(DistributedOptimizer& opt, const RRef& r1,
                          const RRef& r2, const at::Tensor& input) {
    absl::StatusOr<autograd::Context> context =
        autograd::Context::enter(trainer());
    if (!context.ok()) return context.status();
    absl::StatusOr<c10::IValue> w1 = r1.to_here();
    if (!w1.ok()) return w1.status();
    absl::StatusOr<c10::IValue> w2 = r2.to_here();
    if (!w2.ok()) return w2.status();
    at::Tensor loss = loss_of(w1->toTensor(), w2->toTensor(), input);
    absl::Status back = autograd::backward(trainer(), context->id(), {loss});
    if (!back.ok()) return back;
    return opt.step(context->id());
  }

  // Trains with `kind` for 5 steps, distributed and locally, comparing the
  // parameters after every step.
  void expect_matches_local(Kind kind, const Options& options,
                            const std::function<std::unique_ptr<torch::optim::Optimizer>(
                                std::vector<at::Tensor>)>& local_optimizer) {
    auto [w1, r1] = param(1, randn({4, 3}, 1));
    auto [w2, r2] = param(2, randn({3, 1}, 2));
    auto [unused, r3] = param(2, randn({2}, 3));
    at::Tensor unused_before = unused.detach().clone();
    absl::StatusOr<DistributedOptimizer> opt =
        DistributedOptimizer::create(trainer(), kind, {r1, r2, r3}, options);
    ASSERT_THAT(opt, IsOk());
    EXPECT_EQ(opt->owners().size(), 2u);

    at::Tensor l1 = randn({4, 3}, 1).requires_grad_(true);
    at::Tensor l2 = randn({3, 1}, 2).requires_grad_(true);
    std::unique_ptr<torch::optim::Optimizer> local = local_optimizer({l1, l2});
    for (int step = 0; step < 5; ++step) {
      at::Tensor input = randn({8, 4}, 100 + step);
      ASSERT_THAT(train_step(*opt, r1, r2, input), IsOk());
      local->zero_grad();
      loss_of(l1, l2, input).backward();
      local->step();
      EXPECT_TRUE(at::allclose(w1, l1, 1e-6, 1e-6)) << "step " << step;
      EXPECT_TRUE(at::allclose(w2, l2, 1e-6, 1e-6)) << "step " << step;
    }
    // No gradient, no update (even with weight decay), and .grad untouched.
    EXPECT_TRUE(at::equal(unused, unused_before));
    EXPECT_FALSE(w1.grad().defined());
  }
};

TEST_F(DistOptimizer, SGDWithNesterovMomentumMatchesLocal) {
  Options options;
  options.lr = 0.1;
  options.momentum = 0.9;
  options.nesterov = true;
  options.weight_decay = 0.01;
  expect_matches_local(Kind::kSGD, options, [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(
        p, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true)
               .weight_decay(0.01));
  });
}

TEST_F(DistOptimizer, AdamMatchesLocal) {
  Options options;
  options.lr = 0.05;
  options.beta1 = 0.8;
  expect_matches_local(Kind::kAdam, options, [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(
        p, torch::optim::AdamOptions(0.05).betas({0.8, 0.999}));
  });
}

TEST_F(DistOptimizer, AdamWAdagradAndRMSpropMatchLocal) {
  Options adamw;
  adamw.lr = 0.01;
  expect_matches_local(Kind::kAdamW, adamw, [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(
        p, torch::optim::AdamWOptions(0.01));
  });
  Options adagrad;
  adagrad.lr = 0.1;
  adagrad.lr_decay = 0.01;
  expect_matches_local(Kind::kAdagrad, adagrad, [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adagrad>(
        p, torch::optim::AdagradOptions(0.1).lr_decay(0.01));
  });
  Options rmsprop;
  rmsprop.lr = 0.01;
  rmsprop.centered = true;
  rmsprop.momentum = 0.5;
  expect_matches_local(Kind::kRMSprop, rmsprop, [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::RMSprop>(
        p, torch::optim::RMSpropOptions(0.01).centered(true).momentum(0.5));
  });
}

TEST_F(DistOptimizer, BadOptionsAreRefusedHere) {
  auto [w, r] = param(1, randn({2}, 1));
  Options nesterov;
  nesterov.lr = 0.1;
  nesterov.nesterov = true;
  EXPECT_THAT(DistributedOptimizer::create(trainer(), Kind::kAdam, {r}, nesterov),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'nesterov' does not apply to Adam")));
  EXPECT_THAT(DistributedOptimizer::create(trainer(), Kind::kSGD, {r}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SGD needs a learning rate")));
  EXPECT_THAT(DistributedOptimizer::create(trainer(), Kind::kSGD, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(DistOptimizer, ConstructorFailureOnAnOwnerNamesIt) {
  auto [w, r] = param(2, randn({2}, 1));
  Options negative;
  negative.lr = -1;
  EXPECT_THAT(
      DistributedOptimizer::create(trainer(), Kind::kSGD, {r}, negative),
      StatusIs(absl::StatusCode::kUnknown,
               AllOf(HasSubstr("Error on worker 2 (ps2)"),
                     HasSubstr("Invalid learning rate: -1"))));
  RRef not_a_tensor = send_to_trainer(1, c10::IValue(int64_t{7}));
  Options sgd;
  sgd.lr = 0.1;
  EXPECT_THAT(
      DistributedOptimizer::create(trainer(), Kind::kSGD, {r, not_a_tensor},
                                   sgd),
      StatusIs(absl::StatusCode::kUnknown,
               AllOf(HasSubstr("Error on worker 1 (ps1)"),
                     HasSubstr("not a tensor"))));
}

TEST_F(DistOptimizer, ParameterThatRequiresNoGradIsSkipped) {
  // As torch.optim: a frozen parameter gets no gradient and stays as it is.
  auto [w1, r1] = param(1, randn({4, 3}, 1));
  at::Tensor frozen = randn({3, 1}, 2);
  RRef r2 = send_to_trainer(2, frozen);
  Options sgd;
  sgd.lr = 0.1;
  absl::StatusOr<DistributedOptimizer> opt =
      DistributedOptimizer::create(trainer(), Kind::kSGD, {r1, r2}, sgd);
  ASSERT_THAT(opt, IsOk());
  at::Tensor w1_before = w1.detach().clone();
  ASSERT_THAT(train_step(*opt, r1, r2, randn({8, 4}, 100)), IsOk());
  EXPECT_FALSE(at::equal(w1.detach(), w1_before));
  EXPECT_TRUE(at::equal(frozen, randn({3, 1}, 2)));
}

TEST_F(DistOptimizer, StepFailureOnAnOwnerNamesIt) {
  auto [w, r] = param(1, randn({2}, 1));
  Options sgd;
  sgd.lr = 0.1;
  absl::StatusOr<DistributedOptimizer> opt =
      DistributedOptimizer::create(trainer(), Kind::kSGD, {r}, sgd);
  ASSERT_THAT(opt, IsOk());
  // A context that is gone (a step from inside a context makes the owners
  // part of it, so this one is left first).
  int64_t gone = -1;
  {
    absl::StatusOr<autograd::Context> context =
        autograd::Context::enter(trainer());
    ASSERT_THAT(context, IsOk());
    gone = context->id();
  }
  EXPECT_THAT(opt->step(gone),
              StatusIs(absl::StatusCode::kUnknown,
                       AllOf(HasSubstr("Error on worker 1 (ps1)"),
                             HasSubstr("no distributed autograd context"))));
}

TEST_F(DistOptimizer, StateSavesAndRestores) {
  auto [w1, r1] = param(1, randn({4, 3}, 1));
  auto [w2, r2] = param(2, randn({3, 1}, 2));
  Options adam;
  adam.lr = 0.05;
  absl::StatusOr<DistributedOptimizer> first =
      DistributedOptimizer::create(trainer(), Kind::kAdam, {r1, r2}, adam);
  ASSERT_THAT(first, IsOk());
  const at::Tensor input = randn({8, 4}, 7);
  for (int step = 0; step < 3; ++step) {
    ASSERT_THAT(train_step(*first, r1, r2, input), IsOk());
  }
  absl::StatusOr<std::vector<std::string>> state = first->save();
  ASSERT_THAT(state, IsOk());
  ASSERT_EQ(state->size(), 2u);
  const at::Tensor w1_saved = w1.detach().clone();
  const at::Tensor w2_saved = w2.detach().clone();
  ASSERT_THAT(train_step(*first, r1, r2, input), IsOk());
  const at::Tensor w1_next = w1.detach().clone();

  auto rewind = [&] {
    at::NoGradGuard no_grad;
    w1.copy_(w1_saved);
    w2.copy_(w2_saved);
  };
  // A new optimizer over the same parameters, resumed from the state:
  // the same step as the first one took.
  rewind();
  absl::StatusOr<DistributedOptimizer> resumed =
      DistributedOptimizer::create(trainer(), Kind::kAdam, {r1, r2}, adam);
  ASSERT_THAT(resumed, IsOk());
  ASSERT_THAT(resumed->load(*state), IsOk());
  ASSERT_THAT(train_step(*resumed, r1, r2, input), IsOk());
  EXPECT_TRUE(at::allclose(w1, w1_next, 1e-6, 1e-6));
  // Without the state, Adam's first step is a different one.
  rewind();
  absl::StatusOr<DistributedOptimizer> fresh =
      DistributedOptimizer::create(trainer(), Kind::kAdam, {r1, r2}, adam);
  ASSERT_THAT(fresh, IsOk());
  ASSERT_THAT(train_step(*fresh, r1, r2, input), IsOk());
  EXPECT_FALSE(at::allclose(w1, w1_next, 1e-6, 1e-6));

  EXPECT_THAT(resumed->load({"x"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 optimizer states for 2 owners")));
  EXPECT_FALSE(resumed->load({"garbage", "garbage"}).ok());
}

// Each owner's state_dict() and load_state_dict(state), as a checkpoint
// calls them on that owner (tether/checkpoint.h).
TEST_F(DistOptimizer, EachOwnersStateDictRestoresItsOptimizer) {
  auto [w1, r1] = param(1, randn({4, 3}, 1));
  auto [w2, r2] = param(2, randn({3, 1}, 2));
  Options sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  absl::StatusOr<DistributedOptimizer> first =
      DistributedOptimizer::create(trainer(), Kind::kSGD, {r1, r2}, sgd);
  ASSERT_THAT(first, IsOk());
  ASSERT_EQ(first->local_optimizers().size(), 2u);
  const at::Tensor input = randn({8, 4}, 7);
  for (int step = 0; step < 3; ++step) {
    ASSERT_THAT(train_step(*first, r1, r2, input), IsOk());
  }
  std::vector<at::Tensor> states;
  for (const RRef& owner : first->local_optimizers()) {
    absl::StatusOr<c10::IValue> state =
        owner.rpc_sync().call("state_dict", {});
    ASSERT_THAT(state, IsOk());
    ASSERT_TRUE(state->isTensor());
    EXPECT_EQ(state->toTensor().scalar_type(), at::kByte);
    states.push_back(state->toTensor());
  }
  const at::Tensor w1_saved = w1.detach().clone();
  const at::Tensor w2_saved = w2.detach().clone();
  ASSERT_THAT(train_step(*first, r1, r2, input), IsOk());
  const at::Tensor w1_next = w1.detach().clone();
  {
    at::NoGradGuard no_grad;
    w1.copy_(w1_saved);
    w2.copy_(w2_saved);
  }
  absl::StatusOr<DistributedOptimizer> resumed =
      DistributedOptimizer::create(trainer(), Kind::kSGD, {r1, r2}, sgd);
  ASSERT_THAT(resumed, IsOk());
  for (size_t i = 0; i < states.size(); ++i) {
    ASSERT_THAT(resumed->local_optimizers()[i].rpc_sync().call(
                    "load_state_dict", {states[i]}),
                IsOk());
  }
  ASSERT_THAT(train_step(*resumed, r1, r2, input), IsOk());
  // The momentum came back with the state: the very step the first took.
  EXPECT_TRUE(at::equal(w1, w1_next));
  EXPECT_THAT(resumed->local_optimizers()[0].rpc_sync().call(
                  "load_state_dict", {at::zeros({2, 2})}),
              StatusIs(absl::StatusCode::kUnknown,
                       HasSubstr("1-dimensional uint8 tensor")));
}

}  // namespace
}  // namespace tether::optim
