// Distributed autograd between three workers in one process over loopback:
// gradients against LibTorch's local autograd, contexts, errors.
#include "autograd/autograd.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "autograd/autograd_testing.h"
#include "autograd/rref_backward.h"
#include "backends/faulty/faulty_agent.h"
#include "rref/rref.h"
#include "rref/rref_testing.h"
#include "testing/loopback_group.h"
#include "testing/status_matchers.h"

namespace tether::autograd {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

// A fresh leaf that requires grad, the same values for a given seed.
at::Tensor leaf(std::vector<int64_t> sizes, int64_t seed,
                at::ScalarType dtype = at::kFloat) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(dtype))
      .requires_grad_(true);
}

// The gradient `grads` holds for `t` (a test failure and an empty tensor if
// none).
at::Tensor grad_of(const c10::Dict<at::Tensor, at::Tensor>& grads,
                   const at::Tensor& t) {
  auto it = grads.find(t);
  if (it == grads.end()) {
    ADD_FAILURE() << "no gradient for a tensor of shape " << t.sizes();
    return at::Tensor();
  }
  return it->value();
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected,
                  double tolerance = 1e-6) {
  ASSERT_TRUE(actual.defined());
  ASSERT_TRUE(expected.defined());
  EXPECT_EQ(actual.sizes(), expected.sizes());
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(at::allclose(actual, expected, tolerance, tolerance))
      << "actual\n" << actual << "\nexpected\n" << expected;
}

class DistAutograd : public testing::LoopbackGroup {
 protected:
  void SetUp() override {
    start(testing::group_options("autograd_test"), {"alice", "bob", "carol"},
          {rref_extension(), autograd_extension()});
  }

  Worker& a() { return *workers_[0]; }
  Worker& b() { return *workers_[1]; }
  Worker& c() { return *workers_[2]; }

  at::Tensor call(const std::string& to, const std::string& fn,
                  std::vector<c10::IValue> args) {
    absl::StatusOr<c10::IValue> r = a().rpc_sync(to, fn, std::move(args));
    EXPECT_THAT(r, IsOk());
    return r.ok() ? r->toTensor() : at::Tensor();
  }

  c10::Dict<at::Tensor, at::Tensor> grads(Worker& w, int64_t context) {
    absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> g =
        get_gradients(w, context);
    EXPECT_THAT(g, IsOk());
    return g.ok() ? *g : c10::Dict<at::Tensor, at::Tensor>();
  }
};

TEST_F(DistAutograd, ContextIdsCarryTheWorkerAndDoNotNest) {
  {
    absl::StatusOr<Context> context = Context::enter(b());
    ASSERT_THAT(context, IsOk());
    EXPECT_EQ(context->id() >> 48, 1);
    EXPECT_THAT(current_context_id(), IsOk());
    EXPECT_EQ(*current_context_id(), context->id());
    EXPECT_THAT(Context::enter(a()),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("do not nest")));
  }
  EXPECT_THAT(current_context_id(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  EXPECT_EQ(context->id() >> 48, 0);
  EXPECT_THAT(backward(a(), context->id() + 1000, {leaf({}, 1)}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no distributed autograd context")));
  EXPECT_THAT(get_gradients(a(), context->id() + 1000),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(DistAutograd, BadRootsAreRefused) {
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor x = leaf({3}, 1);
  EXPECT_THAT(backward(a(), context->id(), {x * 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("root 0 of backward must be a scalar")));
  EXPECT_THAT(backward(a(), context->id(), {at::ones({})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not")));
  EXPECT_THAT(backward(a(), context->id(), {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(DistAutograd, OneRemoteAddAndMul) {
  at::Tensor x = leaf({3, 2}, 1), w = leaf({3, 2}, 2);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor sum = call("bob", "aten::add.Tensor", {x, w});
  at::Tensor product = call("bob", "aten::mul.Tensor", {sum, w});
  at::Tensor loss = (product * product).sum();
  ASSERT_THAT(backward(a(), context->id(), {loss}), IsOk());

  at::Tensor lx = leaf({3, 2}, 1), lw = leaf({3, 2}, 2);
  at::Tensor local = (((lx + lw) * lw) * ((lx + lw) * lw)).sum();
  local.backward();
  auto g = grads(a(), context->id());
  expect_close(grad_of(g, x), lx.grad());
  expect_close(grad_of(g, w), lw.grad());
  EXPECT_FALSE(x.grad().defined()) << ".grad must be left alone";
}

TEST_F(DistAutograd, LeafHooksRunAndALoneGradientIsKeptWithoutACopy) {
  at::Tensor x = leaf({3}, 5);
  x.register_hook([](const at::Tensor& g) { return g * 2; });
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("bob", "aten::mul.Tensor", {x, x});
  ASSERT_THAT(backward(a(), context->id(), {y.sum()}), IsOk());
  // The hook doubled d(x*x)/dx = 2x, as in a local backward.
  expect_close(grad_of(grads(a(), context->id()), x), 4 * x.detach());
  EXPECT_FALSE(x.grad().defined());

  // A gradient nothing else holds is the context's as it is; one that two
  // leaves receive is copied for each (AccumulateGrad's rule).
  at::Tensor u = leaf({2}, 6), v = leaf({2}, 7);
  absl::StatusOr<Context> second = Context::enter(a());
  EXPECT_FALSE(second.ok());  // contexts do not nest
  ASSERT_THAT(backward(a(), context->id(), {(u + v).sum()}), IsOk());
  auto g = grads(a(), context->id());
  EXPECT_NE(grad_of(g, u).data_ptr(), grad_of(g, v).data_ptr());
  expect_close(grad_of(g, u), at::ones({2}));
}

TEST_F(DistAutograd, RoundTripsABAB) {
  at::Tensor x = leaf({4}, 3), w = leaf({4}, 4);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("bob", "aten::mul.Tensor", {x, w});
  at::Tensor z = at::sin(y) * x;
  at::Tensor y2 = call("bob", "aten::mul.Tensor", {z, y});
  at::Tensor y3 = call("bob", "aten::exp", {y2 * 0.1});
  ASSERT_THAT(backward(a(), context->id(), {(y3 + z).sum()}), IsOk());

  at::Tensor lx = leaf({4}, 3), lw = leaf({4}, 4);
  at::Tensor ly = lx * lw;
  at::Tensor lz = at::sin(ly) * lx;
  ((at::exp(lz * ly * 0.1)) + lz).sum().backward();
  auto g = grads(a(), context->id());
  expect_close(grad_of(g, x), lx.grad());
  expect_close(grad_of(g, w), lw.grad());
}

TEST_F(DistAutograd, NestedChainABC) {
  at::Tensor x = leaf({5}, 5), w = leaf({5}, 6);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("bob", testing::kMulVia, {std::string("carol"), x, w});
  ASSERT_THAT(backward(a(), context->id(), {(y * y).sum()}), IsOk());

  at::Tensor lx = leaf({5}, 5), lw = leaf({5}, 6);
  at::Tensor ly = lx * 2 * lw + lx;
  (ly * ly).sum().backward();
  auto g = grads(a(), context->id());
  expect_close(grad_of(g, x), lx.grad());
  expect_close(grad_of(g, w), lw.grad());
  // bob and carol took part: the context lives there until it is left.
  EXPECT_EQ(*live_contexts(b()), 1);
  EXPECT_EQ(*live_contexts(c()), 1);
}

TEST_F(DistAutograd, MultipleRootsAndOutputs) {
  at::Tensor x = leaf({3}, 7), w = leaf({3}, 8);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<c10::IValue> both =
      a().rpc_sync("bob", testing::kTwoOutputs, {x, w});
  ASSERT_THAT(both, IsOk());
  at::Tensor p = both->toTupleRef().elements()[0].toTensor();
  at::Tensor s = both->toTupleRef().elements()[1].toTensor();
  ASSERT_THAT(backward(a(), context->id(), {p.sum(), (s * p).sum()}), IsOk());

  at::Tensor lx = leaf({3}, 7), lw = leaf({3}, 8);
  at::Tensor lp = lx * lw, ls = at::sin(lx);
  torch::autograd::backward({lp.sum(), (ls * lp).sum()});
  auto g = grads(a(), context->id());
  expect_close(grad_of(g, x), lx.grad());
  expect_close(grad_of(g, w), lw.grad());
}

TEST_F(DistAutograd, UnusedTensorsAndUnusedResults) {
  at::Tensor x = leaf({3}, 9), w = leaf({3}, 10), u = leaf({3}, 11);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  // The first output (x * u) is unused: u gets no gradient.
  absl::StatusOr<c10::IValue> both =
      a().rpc_sync("bob", testing::kTwoOutputs, {x, u});
  ASSERT_THAT(both, IsOk());
  at::Tensor s = both->toTupleRef().elements()[1].toTensor();
  // A remote result never used at all (FAST mode's weak spot in the peer):
  // no gradient flows back to its send node, and nothing waits for one.
  at::Tensor ignored = call("carol", "aten::mul.Tensor", {x, w});
  ASSERT_TRUE(ignored.requires_grad());
  ASSERT_THAT(backward(a(), context->id(), {(s * 3).sum()}), IsOk());

  at::Tensor lx = leaf({3}, 9);
  (at::sin(lx) * 3).sum().backward();
  auto g = grads(a(), context->id());
  expect_close(grad_of(g, x), lx.grad());
  EXPECT_FALSE(g.contains(u));
  EXPECT_FALSE(g.contains(w));
}

TEST_F(DistAutograd, DtypesSurviveAndFloat64IsExact) {
  at::Tensor x = leaf({4}, 12, at::kDouble);
  at::Tensor f = leaf({4}, 13, at::kFloat);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("bob", "aten::mul.Tensor", {x, x});
  at::Tensor z = call("carol", "aten::mul.Scalar", {f, 3.0});
  ASSERT_EQ(y.scalar_type(), at::kDouble);
  ASSERT_THAT(backward(a(), context->id(), {y.sum(), z.sum()}), IsOk());
  auto g = grads(a(), context->id());
  EXPECT_TRUE(at::equal(grad_of(g, x), x.detach() * 2));
  EXPECT_TRUE(at::equal(grad_of(g, f), at::full({4}, 3.0f)));
}

TEST_F(DistAutograd, RetainGraphTwiceAccumulates) {
  at::Tensor x = leaf({3}, 14);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("bob", "aten::mul.Tensor", {x, x});
  at::Tensor loss = at::sin(y).sum();
  ASSERT_THAT(backward(a(), context->id(), {loss}, /*retain_graph=*/true),
              IsOk());
  at::Tensor once = grad_of(grads(a(), context->id()), x).clone();
  ASSERT_THAT(backward(a(), context->id(), {loss}, /*retain_graph=*/true),
              IsOk());
  expect_close(grad_of(grads(a(), context->id()), x), once * 2);
  ASSERT_THAT(backward(a(), context->id(), {loss}), IsOk());
  expect_close(grad_of(grads(a(), context->id()), x), once * 3);
  // Without retain_graph the graph's saved tensors are gone, as locally.
  EXPECT_THAT(backward(a(), context->id(), {loss}),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("second time")));
}

TEST_F(DistAutograd, ThroughRRefToHere) {
  at::Tensor x = leaf({3}, 15), w = leaf({3}, 16);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<RRef> r = remote(a(), "bob", "aten::mul.Tensor", {x, w});
  ASSERT_THAT(r, IsOk());
  absl::StatusOr<c10::IValue> y = r->to_here();
  ASSERT_THAT(y, IsOk());
  // Twice: each to_here is its own message pair; gradients add up.
  absl::StatusOr<c10::IValue> y2 = r->to_here();
  ASSERT_THAT(y2, IsOk());
  at::Tensor loss = (y->toTensor() * y2->toTensor()).sum();
  ASSERT_THAT(backward(a(), context->id(), {loss}), IsOk());

  at::Tensor lx = leaf({3}, 15), lw = leaf({3}, 16);
  ((lx * lw) * (lx * lw)).sum().backward();
  auto g = grads(a(), context->id());
  expect_close(grad_of(g, x), lx.grad());
  expect_close(grad_of(g, w), lw.grad());
}

TEST_F(DistAutograd, RemoteModuleThroughProxy) {
  absl::StatusOr<RRef> module =
      remote(a(), "bob", testing::kLinear, {int64_t{4}, int64_t{3}, int64_t{17}});
  ASSERT_THAT(module, IsOk());
  at::Tensor x = leaf({2, 4}, 18);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<c10::IValue> y = module->rpc_sync().call("forward", {x});
  ASSERT_THAT(y, IsOk());
  ASSERT_THAT(backward(a(), context->id(), {y->toTensor().pow(2).sum()}),
              IsOk());
  absl::StatusOr<c10::IValue> remote_grads =
      module->rpc_sync().call("grads", {context->id()});
  ASSERT_THAT(remote_grads, IsOk());

  at::Generator gen = at::detail::createCPUGenerator(17);
  at::Tensor lw = at::randn({3, 4}, gen).requires_grad_(true);
  at::Tensor lb = at::randn({3}, gen).requires_grad_(true);
  at::Tensor lx = leaf({2, 4}, 18);
  at::addmm(lb, lx, lw.t()).pow(2).sum().backward();
  std::vector<at::Tensor> g = remote_grads->toTensorVector();
  ASSERT_EQ(g.size(), 2u);
  expect_close(g[0], lw.grad());
  expect_close(g[1], lb.grad());
  expect_close(grad_of(grads(a(), context->id()), x), lx.grad());
}

TEST_F(DistAutograd, RRefBackwardOnItsOwner) {
  at::Tensor x = leaf({3}, 19), w = leaf({3}, 20);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<RRef> r = remote(a(), "bob", "aten::dot", {x, w});
  ASSERT_THAT(r, IsOk());
  ASSERT_THAT(backward(*r, context->id()), IsOk());
  auto g = grads(a(), context->id());
  expect_close(grad_of(g, x), w.detach());
  expect_close(grad_of(g, w), x.detach());

  absl::StatusOr<RRef> vector = remote(a(), "bob", "aten::mul.Tensor", {x, w});
  ASSERT_THAT(vector, IsOk());
  EXPECT_THAT(backward(*vector, context->id()),
              StatusIs(absl::StatusCode::kUnknown,
                       HasSubstr("must be a scalar")));

  // A value that is no tensor: the peer's text, which its programs match.
  absl::StatusOr<RRef> number =
      remote(a(), "bob", "aten::len", {c10::List<int64_t>({1, 2})});
  ASSERT_THAT(number, IsOk());
  absl::Status not_a_tensor = backward(*number, context->id());
  EXPECT_FALSE(not_a_tensor.ok());
  EXPECT_THAT(std::string(not_a_tensor.message()),
              HasSubstr("RRef should contain a tensor for .backward()"));
}

TEST_F(DistAutograd, ErrorInRemoteBackwardReachesTheRoot) {
  at::Tensor x = leaf({3}, 21);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("carol", testing::kFailBackward, {x * 2});
  at::Tensor z = call("bob", "aten::mul.Tensor", {y, y});
  absl::Status failed = backward(a(), context->id(), {z.sum()});
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kInternal,
                               HasSubstr("backward pass on worker 2 (carol)")));
  EXPECT_THAT(failed,
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("Error on Node 2: injected failure in "
                                 "backward")));
}

TEST_F(DistAutograd, AContextHoldsItsSendAndRecvNodes) {
  at::Tensor x = leaf({3}, 24), w = leaf({3}, 25);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("bob", "aten::mul.Tensor", {x, w});
  // alice: the request's send node (next edges: x's and w's accumulators)
  // and the response's recv node (y's grad_fn), named as the peer's.
  absl::StatusOr<ContextNodes> mine = context_nodes(a(), context->id());
  ASSERT_THAT(mine, IsOk());
  ASSERT_EQ(mine->sends.size(), 1u);
  ASSERT_EQ(mine->recvs.size(), 1u);
  const std::shared_ptr<torch::autograd::Node>& send =
      mine->sends.begin()->second;
  EXPECT_EQ(send->name(), "torch::distributed::autograd::SendRpcBackward");
  ASSERT_EQ(send->num_outputs(), 2u);
  EXPECT_EQ(send->next_edge(0).function,
            torch::autograd::impl::gradient_edge(x).function);
  EXPECT_EQ(send->next_edge(1).function,
            torch::autograd::impl::gradient_edge(w).function);
  EXPECT_EQ(y.grad_fn(), mine->recvs.begin()->second);
  EXPECT_EQ(y.grad_fn()->name(),
            "torch::distributed::autograd::RecvRpcBackward");
  // bob: the request's recv node and the response's send node. A message's
  // id carries its sender's rank in the top bits, so ids are unique.
  absl::StatusOr<ContextNodes> bobs = context_nodes(b(), context->id());
  ASSERT_THAT(bobs, IsOk());
  ASSERT_EQ(bobs->recvs.size(), 1u);
  ASSERT_EQ(bobs->sends.size(), 1u);
  EXPECT_EQ(bobs->recvs.begin()->first, mine->sends.begin()->first);
  EXPECT_EQ(mine->recvs.begin()->first, bobs->sends.begin()->first);
  EXPECT_EQ(mine->sends.begin()->first >> 48, 0);
  EXPECT_EQ(bobs->sends.begin()->first >> 48, 1);
  EXPECT_THAT(context_nodes(c(), context->id()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Could not find autograd context")));
}

TEST_F(DistAutograd, LocalBackwardThroughARecvNodeIsAClearError) {
  at::Tensor x = leaf({3}, 22);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  at::Tensor y = call("bob", "aten::mul.Tensor", {x, x});
  try {
    y.sum().backward();
    ADD_FAILURE() << "a local backward through a recv node must throw";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tether::autograd::backward"));
  }
}

TEST_F(DistAutograd, LeavingAContextCleansItEverywhere) {
  at::Tensor x = leaf({3}, 23);
  int64_t id = -1;
  {
    absl::StatusOr<Context> context = Context::enter(a());
    ASSERT_THAT(context, IsOk());
    at::Tensor y = call("bob", testing::kMulVia, {std::string("carol"), x, x});
    ASSERT_THAT(backward(a(), context->id(), {y.sum()}), IsOk());
    EXPECT_EQ(*live_contexts(a()), 1);
    EXPECT_EQ(*live_contexts(b()), 1);
    EXPECT_EQ(*live_contexts(c()), 1);
    // Who each worker's copy exchanged messages with (ranks): the release
    // follows these.
    using Ranks = std::vector<int32_t>;
    EXPECT_EQ(context_peers(a(), context->id()).value_or(Ranks{}), Ranks({1}));
    EXPECT_EQ(context_peers(b(), context->id()).value_or(Ranks{}),
              Ranks({0, 2}));
    EXPECT_EQ(context_peers(c(), context->id()).value_or(Ranks{}), Ranks({1}));
    id = context->id();
  }
  // The exit started the release; it reaches bob, then carol through bob.
  EXPECT_EQ(*live_contexts(a()), 0);
  EXPECT_THAT(context_peers(a(), id),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Could not find autograd context with id")));
  ASSERT_THAT(await_releases(a(), absl::Now() + kBound), IsOk());
  EXPECT_EQ(*live_contexts(b()), 0);
  EXPECT_EQ(*live_contexts(c()), 0);
  EXPECT_THAT(context_peers(c(), id),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("carol")));
  // Calls outside a context carry no autograd: nothing is recorded.
  at::Tensor y = call("bob", "aten::mul.Tensor", {x, x});
  EXPECT_TRUE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_EQ(*live_contexts(b()), 0);
}

TEST_F(DistAutograd, ManyContextsConcurrently) {
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      at::Tensor x = leaf({8}, 100 + i);
      for (int step = 0; step < 10; ++step) {
        absl::StatusOr<Context> context = Context::enter(a());
        ASSERT_THAT(context, IsOk());
        absl::StatusOr<c10::IValue> y = a().rpc_sync(
            i % 2 ? "bob" : "carol", "aten::mul.Tensor", {x, x});
        ASSERT_THAT(y, IsOk());
        ASSERT_THAT(backward(a(), context->id(), {y->toTensor().sum()}),
                    IsOk());
        auto g = get_gradients(a(), context->id());
        ASSERT_THAT(g, IsOk());
        if (at::allclose(grad_of(*g, x), x.detach() * 2)) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kThreads * 10);
  EXPECT_EQ(*live_contexts(a()), 0);
  ASSERT_THAT(await_releases(a(), absl::Now() + kBound), IsOk());
  EXPECT_EQ(*live_contexts(b()), 0);
  EXPECT_EQ(*live_contexts(c()), 0);
}

TEST_F(DistAutograd, AContextEnteredRightAfterAnExitIsKept) {
  // Each exit's release is still on its way to bob and carol when the next
  // context, which reaches the same workers, is entered: ids are never
  // reused, so a late release cannot take the new context.
  at::Tensor x = leaf({4}, 24);
  for (int step = 0; step < 20; ++step) {
    absl::StatusOr<Context> context = Context::enter(a());
    ASSERT_THAT(context, IsOk());
    at::Tensor y =
        call("bob", testing::kMulVia, {std::string("carol"), x, x});
    ASSERT_THAT(backward(a(), context->id(), {y.sum()}), IsOk());
    // y = 2x * x + x: dy/dx = 4x + 1.
    expect_close(grad_of(grads(a(), context->id()), x), x.detach() * 4 + 1);
  }
  ASSERT_THAT(await_releases(a(), absl::Now() + kBound), IsOk());
  EXPECT_EQ(*live_contexts(a()), 0);
  EXPECT_EQ(*live_contexts(b()), 0);
  EXPECT_EQ(*live_contexts(c()), 0);
}

TEST_F(DistAutograd, AwaitReleasesWithNothingInFlight) {
  EXPECT_THAT(await_releases(a(), absl::Now()), IsOk());
}

// The same group over the faulty backend (wrapping loopback), which delays
// the messages of some types: what a step sends, and when.
class DelayedMessages : public testing::LoopbackGroup {
 protected:
  void start_with(std::string delays) {
    RpcOptions options = testing::group_options("autograd_delayed");
    options.backend = "faulty";
    options.backend_settings["faulty.inner"] = "loopback";
    options.backend_settings["faulty.delay"] = std::move(delays);
    start(options, {"alice", "bob", "carol"},
          {rref_extension(), autograd_extension()});
  }

  Worker& a() { return *workers_[0]; }
  Worker& b() { return *workers_[1]; }
  Worker& c() { return *workers_[2]; }
};

TEST_F(DelayedMessages, LeavingReturnsBeforeThePeersRelease) {
  // Every AUTOGRAD_CLEANUP waits 2 s before it is sent.
  start_with("AUTOGRAD_CLEANUP:2000");
  at::Tensor x = leaf({3}, 25);
  {
    absl::StatusOr<Context> context = Context::enter(a());
    ASSERT_THAT(context, IsOk());
    absl::StatusOr<c10::IValue> y =
        a().rpc_sync("bob", testing::kMulVia, {std::string("carol"), x, x});
    ASSERT_THAT(y, IsOk());
    ASSERT_THAT(backward(a(), context->id(), {y->toTensor().sum()}), IsOk());
  }
  // The exit forgot the context here and did not wait for bob (the peer's
  // exit does not either): bob still has it, and a release is in flight.
  EXPECT_EQ(*live_contexts(a()), 0);
  EXPECT_EQ(*live_contexts(b()), 1);
  EXPECT_THAT(await_releases(a(), absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("1 release")));
  // It still reaches every worker that took part.
  ASSERT_THAT(await_releases(a(), absl::Now() + kBound), IsOk());
  EXPECT_EQ(*live_contexts(b()), 0);
  EXPECT_EQ(*live_contexts(c()), 0);
}

TEST_F(DelayedMessages, GradientsForTheRequesterRideOnTheBackwardResponse) {
  // Every AUTOGRAD_BACKWARD is counted (delayed by 1 ms).
  start_with("AUTOGRAD_BACKWARD:1");
  at::Tensor x = leaf({3}, 26), w = leaf({3}, 27);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<c10::IValue> y =
      a().rpc_sync("bob", "aten::mul.Tensor", {x, w});
  ASSERT_THAT(y, IsOk());
  const int64_t before = backends::injected_faults().delayed;
  ASSERT_THAT(backward(a(), context->id(), {y->toTensor().sum()}), IsOk());
  // alice sent bob one BACKWARD; the gradients bob's pass has for x and w,
  // which came from alice, are in its response: no BACKWARD back.
  EXPECT_EQ(backends::injected_faults().delayed - before, 1);
  auto g = get_gradients(a(), context->id());
  ASSERT_THAT(g, IsOk());
  expect_close(grad_of(*g, x), w.detach());
  expect_close(grad_of(*g, w), x.detach());
}

TEST_F(DelayedMessages, ANestedChainAnswersEachRequesterInItsResponse) {
  start_with("AUTOGRAD_BACKWARD:1");
  at::Tensor x = leaf({5}, 28), w = leaf({5}, 29);
  absl::StatusOr<Context> context = Context::enter(a());
  ASSERT_THAT(context, IsOk());
  absl::StatusOr<c10::IValue> y =
      a().rpc_sync("bob", testing::kMulVia, {std::string("carol"), x, w});
  ASSERT_THAT(y, IsOk());
  const int64_t before = backends::injected_faults().delayed;
  ASSERT_THAT(backward(a(), context->id(), {(y->toTensor() * 2).sum()}),
              IsOk());
  // alice -> bob and bob -> carol; carol answers bob, bob answers alice
  // (its pass and the one carol's answer started both reach alice's x).
  EXPECT_EQ(backends::injected_faults().delayed - before, 2);
  auto g = get_gradients(a(), context->id());
  ASSERT_THAT(g, IsOk());
  // y = 2x * w + x: dy/dx = 2w + 1, dy/dw = 2x; the root doubles both.
  expect_close(grad_of(*g, x), (w.detach() * 2 + 1) * 2);
  expect_close(grad_of(*g, w), x.detach() * 4);
}

}  // namespace
}  // namespace tether::autograd
