// Dynamic membership across real worker processes, on the backend named by
// TETHER_TEST_BACKEND: workers that init without a world size join the
// running group and leave it with their graceful shutdown while the others
// call each other (docs/reliability.md, "Groups that change").
//
// - join during traffic: the members see the joiner the moment its init
//   returns, and calls to it work;
// - leave during traffic: calls in flight to the leaver complete, later
//   ones fail at once with UNAVAILABLE naming it;
// - join and leave cycles of one name and rank;
// - a joiner killed while it holds the membership token holds nobody up
//   for longer than the peer timeout;
// - RRefs owned by a joiner and a distributed backward that crosses to it.
//
// Rank 0 serves the rendezvous store (env://): it starts the group and
// leaves last. The processes order their steps through test keys in that
// same store ("test/..."), waited on with the server's WAIT, never by
// sleeping.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/autograd_testing.h"
#include "backends/builtin.h"
#include "core/toolkit/store_client.h"
#include "core/join/membership.h"
#include "core/rendezvous.h"
#include "core/rpc.h"
#include "rref/rref.h"
#include "testing/multiprocess.h"
#include "testing/scenario_backend.h"
#include "testing/status_matchers.h"
#include "testing/test_ops.h"

namespace tether {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;
using ::tether::testing::backend_under_test;

constexpr absl::Duration kBound = absl::Seconds(60);
constexpr absl::Duration kPeerTimeout = absl::Seconds(2);

RpcOptions options() {
  RpcOptions options;
  options.backend = backend_under_test();
  options.backend_settings = ::tether::testing::backend_settings_under_test();
  options.init_method = "env://";
  options.num_worker_threads = 8;
  options.default_timeout = kBound;
  options.init_timeout = kBound;
  options.peer_timeout = kPeerTimeout;
  return options;
}

const BackendRegistry& registry() {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry;
    EXPECT_THAT(backends::register_builtin_backends(*r), IsOk());
    return r;
  }();
  return *registry;
}

// Joins the group as "w<rank>", without a world size.
absl::Status join(int rank) {
  return init_rpc(absl::StrCat("w", rank), rank, kDynamicGroup, options(),
                  registry(), {rref_extension(), autograd::autograd_extension()});
}

// The group's rendezvous store, for the test's own keys. Connects on first
// use: rank 0's process serves the store once it has joined.
class TestStore {
 public:
  void set(const std::string& key) { store().set("test/" + key, {1}); }
  void wait(const std::string& key) {
    store().wait({"test/" + key}, std::chrono::milliseconds(
                                      absl::ToInt64Milliseconds(kBound)));
  }
  // Counts `key` up; the one that brings it to `n` sets "<key>_all".
  void count(const std::string& key, int n) {
    if (store().add("test/" + key, 1) == n) set(key + "_all");
  }
  std::shared_ptr<c10d::Store> shared() {
    store();
    c10::intrusive_ptr<internal::TcpStoreClient> keep = store_;
    return std::shared_ptr<c10d::Store>(keep.get(), [keep](c10d::Store*) {});
  }

 private:
  internal::TcpStoreClient& store() {
    if (!store_) {
      absl::StatusOr<c10::intrusive_ptr<internal::TcpStoreClient>> client =
          internal::TcpStoreClient::connect(
              std::getenv("MASTER_ADDR"), std::atoi(std::getenv("MASTER_PORT")),
              kBound);
      if (!client.ok()) {
        ADD_FAILURE() << client.status();
        std::abort();
      }
      store_ = *client;
    }
    return *store_;
  }

  c10::intrusive_ptr<internal::TcpStoreClient> store_;
};

at::Tensor add_on(const std::string& to, int64_t n) {
  absl::StatusOr<c10::IValue> sum =
      rpc_sync(to, "aten::add.Tensor", {at::full({4}, n), at::ones({4})});
  EXPECT_THAT(sum, IsOk()) << "a call to " << to;
  return sum.ok() ? sum->toTensor() : at::full({4}, -1);
}

bool is_member(const std::string& name) {
  absl::StatusOr<std::vector<WorkerInfo>> all = get_all_worker_infos();
  if (!all.ok()) return false;
  for (const WorkerInfo& info : *all) {
    if (info.name == name) return true;
  }
  return false;
}

// Rank 0, once the others have left: it sees the group empty but for
// itself, and leaves last.
void leave_last(TestStore& store, int others) {
  if (others > 0) store.wait("left_all");
  absl::StatusOr<std::vector<WorkerInfo>> all = get_all_worker_infos();
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->size(), 1u) << "members left behind";
  EXPECT_THAT(shutdown(), IsOk());
}

// The usual order of three: w0 starts the group, w1 joins, then w2; w0
// leaves last, once the others have. True for w1 and w2, joined.
bool join_in_order(TestStore& store, int rank) {
  if (rank != 0) store.wait("w0_in");
  if (rank == 2) store.wait("w1_in");
  EXPECT_THAT(join(rank), IsOk());
  if (::testing::Test::HasFailure()) return false;
  if (rank == 0) {
    store.set("w0_in");
    leave_last(store, 2);
    return false;
  }
  if (rank == 1) store.set("w1_in");
  return true;
}

TEST(MembershipScenarios, JoinDuringTraffic) {
  ::tether::testing::run_in_processes(3, [](int rank, int) {
    TestStore store;
    if (rank == 2) store.wait("w1_calling");  // joins into w1's traffic
    ASSERT_THAT(join(rank), IsOk());
    if (rank == 0) {
      store.set("w0_in");
      store.wait("w2_in");
      // The joiner's init returned: this member knows it already.
      EXPECT_TRUE(is_member("w2"));
      absl::StatusOr<c10::IValue> who = rpc_sync("w2", testing::kWhoami, {});
      ASSERT_THAT(who, IsOk());
      EXPECT_EQ(who->toStringRef(), "w2");
      store.set("w0_called_w2");
      leave_last(store, 2);
      return;
    }
    if (rank == 1) {
      store.wait("w0_in");
      int to_w0 = 0, to_w2 = 0;
      bool signalled = false;
      // Calls w0 without a pause; once w2 is in, calls both.
      while (to_w2 < 50) {
        EXPECT_TRUE(at::equal(add_on("w0", to_w0), at::full({4}, to_w0 + 1)));
        ++to_w0;
        if (!signalled && to_w0 == 5) {
          store.set("w1_calling");
          signalled = true;
        }
        if (is_member("w2")) {
          EXPECT_TRUE(at::equal(add_on("w2", to_w2), at::full({4}, to_w2 + 1)));
          ++to_w2;
        }
        if (::testing::Test::HasFailure()) return;
      }
      std::printf("w1: %d calls to w0 while w2 joined, then %d to w2\n",
                  to_w0, to_w2);
      store.set("w1_done");
      store.wait("w2_done");  // w2's calls to w1 are over
    }
    if (rank == 2) {
      store.set("w2_in");
      for (int i = 0; i < 20; ++i) {
        EXPECT_TRUE(at::equal(add_on("w0", i), at::full({4}, i + 1)));
        EXPECT_TRUE(at::equal(add_on("w1", i), at::full({4}, i + 1)));
      }
      store.set("w2_done");
      store.wait("w1_done");       // w1's calls to w2 are over
      store.wait("w0_called_w2");  // and w0's
    }
    EXPECT_THAT(shutdown(), IsOk());
    store.count("left", 2);
  });
}

TEST(MembershipScenarios, LeaveDuringTraffic) {
  ::tether::testing::run_in_processes(3, [](int rank, int) {
    TestStore store;
    if (!join_in_order(store, rank)) return;
    if (rank == 1) {
      store.wait("w2_in");
      // Calls w2 (slow calls, so that some are in flight when it leaves)
      // until a call fails: it must fail at once, naming w2.
      int ok = 0;
      absl::Status failed;
      const absl::Time deadline = absl::Now() + kBound;
      while (failed.ok() && absl::Now() < deadline) {
        std::vector<Future<c10::IValue>> calls;
        for (int i = 0; i < 4; ++i) {
          calls.push_back(rpc_async("w2", testing::kSlow, {int64_t{20}}));
        }
        if (ok == 8) store.set("w1_calling");
        for (Future<c10::IValue>& call : calls) {
          absl::StatusOr<c10::IValue> result = call.get();
          if (result.ok()) {
            EXPECT_EQ(result->toInt(), 20);
            ++ok;
          } else if (failed.ok()) {
            failed = result.status();
          }
        }
      }
      EXPECT_GE(ok, 8);
      // A call that was in flight when w2 began to leave was served; only
      // calls made after are refused, at once, naming w2.
      EXPECT_THAT(failed, StatusIs(absl::StatusCode::kUnavailable,
                                   AllOf(HasSubstr("w2"),
                                         HasSubstr("left the group"))));
      store.wait("w2_left");
      const absl::Time start = absl::Now();
      EXPECT_THAT(rpc_sync("w2", testing::kWhoami, {}).status(),
                  StatusIs(absl::StatusCode::kUnavailable,
                           HasSubstr("'w2' (rank 2) has left the group")));
      EXPECT_LT(absl::Now() - start, absl::Seconds(1));
      EXPECT_FALSE(is_member("w2"));
      // The rest of the group works on.
      EXPECT_TRUE(at::equal(add_on("w0", 1), at::full({4}, 2)));
      std::printf("w1: %d calls to w2 served before it left; then %s\n", ok,
                  failed.ToString().c_str());
    }
    if (rank == 2) {
      store.set("w2_in");
      store.wait("w1_calling");
      EXPECT_THAT(shutdown(), IsOk());
      store.set("w2_left");
      store.count("left", 2);
      return;
    }
    EXPECT_THAT(shutdown(), IsOk());
    store.count("left", 2);
  });
}

TEST(MembershipScenarios, JoinAndLeaveCycles) {
  constexpr int kCycles = 3;
  ::tether::testing::run_in_processes(3, [](int rank, int) {
    TestStore store;
    if (rank != 0) store.wait("w0_in");
    if (rank == 2) store.wait("w1_in");
    if (rank == 0) {
      ASSERT_THAT(join(rank), IsOk());
      store.set("w0_in");
      leave_last(store, 2);
      return;
    }
    if (rank == 1) {
      ASSERT_THAT(join(rank), IsOk());
      store.set("w1_in");
      // Calls w0 throughout, and w2 in each cycle it is there.
      for (int cycle = 0; cycle < kCycles; ++cycle) {
        store.wait(absl::StrCat("w2_in_", cycle));
        EXPECT_TRUE(is_member("w2"));
        EXPECT_TRUE(at::equal(add_on("w2", cycle), at::full({4}, cycle + 1)));
        EXPECT_TRUE(at::equal(add_on("w0", cycle), at::full({4}, cycle + 1)));
        store.set(absl::StrCat("w1_called_", cycle));
        store.wait(absl::StrCat("w2_out_", cycle));
        EXPECT_THAT(rpc_sync("w2", testing::kWhoami, {}).status(),
                    StatusIs(absl::StatusCode::kUnavailable,
                             HasSubstr("has left the group")));
      }
      EXPECT_THAT(shutdown(), IsOk());
      store.count("left", 2);
      return;
    }
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      ASSERT_THAT(join(rank), IsOk()) << "cycle " << cycle;
      EXPECT_TRUE(at::equal(add_on("w0", cycle), at::full({4}, cycle + 1)));
      EXPECT_TRUE(at::equal(add_on("w1", cycle), at::full({4}, cycle + 1)));
      store.set(absl::StrCat("w2_in_", cycle));
      store.wait(absl::StrCat("w1_called_", cycle));
      ASSERT_THAT(shutdown(), IsOk()) << "cycle " << cycle;
      store.set(absl::StrCat("w2_out_", cycle));
    }
    store.count("left", 2);
  });
}

// A joiner that dies holding the membership token (SIGKILL, after it
// claimed its name and rank): the next joiner takes the token over once the
// dead one's heartbeat has stood still for the peer timeout, and the group
// never hears of the dead one.
TEST(MembershipScenarios, AJoinerKilledMidJoinHoldsNobodyUp) {
  ::tether::testing::run_in_processes(
      4,
      [](int rank, int) {
        TestStore store;
        if (rank == 0) {
          ASSERT_THAT(join(rank), IsOk());
          store.set("w0_in");
          store.wait("w3_in");
          EXPECT_FALSE(is_member("w2"));
          EXPECT_TRUE(is_member("w3"));
          EXPECT_TRUE(at::equal(add_on("w3", 1), at::full({4}, 2)));
          store.set("w0_called_w3");
          leave_last(store, 2);
          return;
        }
        store.wait("w0_in");
        if (rank == 2) {
          auto token = join::MembershipToken::acquire(
              store.shared(), WorkerInfo{"w2", 2},
              join::MembershipToken::Op::kJoin, kPeerTimeout,
              absl::Now() + kBound);
          ASSERT_THAT(token.status(), IsOk());
          ASSERT_THAT((*token)->claim(), IsOk());
          store.set("w2_holds_the_token");
          ::kill(::getpid(), SIGKILL);
        }
        if (rank == 1) {
          const absl::Time start = absl::Now();
          ASSERT_THAT(join(rank), IsOk());
          std::printf("w1: joined in %s (the dead joiner may have held the "
                      "token)\n",
                      absl::FormatDuration(absl::Now() - start).c_str());
          store.set("w1_in");
          store.wait("w3_in");
          EXPECT_TRUE(at::equal(add_on("w3", 2), at::full({4}, 3)));
          EXPECT_THAT(rpc_sync("w2", testing::kWhoami, {}).status(),
                      StatusIs(absl::StatusCode::kNotFound,
                               HasSubstr("unknown worker 'w2'")));
          store.set("w1_called_w3");
        }
        if (rank == 3) {
          store.wait("w2_holds_the_token");
          store.wait("w1_in");
          const absl::Time start = absl::Now();
          ASSERT_THAT(join(rank), IsOk());
          const absl::Duration took = absl::Now() - start;
          std::printf("w3: joined %s after the dead joiner took the token\n",
                      absl::FormatDuration(took).c_str());
          EXPECT_LT(took, kPeerTimeout + absl::Seconds(10));
          store.set("w3_in");
          EXPECT_TRUE(at::equal(add_on("w1", 3), at::full({4}, 4)));
          // w3 stays a member until w0 and w1 have called it: a worker that
          // has left is refused ("has left the group"), as it should be.
          store.wait("w0_called_w3");
          store.wait("w1_called_w3");
        }
        EXPECT_THAT(shutdown(), IsOk());
        store.count("left", 2);
      },
      absl::Seconds(120), /*may_die=*/{2});
}

// An RRef owned by a joiner, used by an original member; a distributed
// backward that crosses to the joiner and back (the peer does not support
// distributed autograd in dynamic groups).
TEST(MembershipScenarios, RRefsAndDistributedAutogradWithAJoiner) {
  ::tether::testing::run_in_processes(3, [](int rank, int) {
    TestStore store;
    if (!join_in_order(store, rank)) return;
    if (rank == 1) {
      store.wait("w2_in");
      // An RRef the joiner owns.
      absl::StatusOr<RRef> sum =
          remote("w2", "aten::add.Tensor", {at::ones({3}), at::ones({3})});
      ASSERT_THAT(sum, IsOk());
      EXPECT_EQ(sum->owner().name, "w2");
      absl::StatusOr<c10::IValue> value = sum->to_here();
      ASSERT_THAT(value, IsOk());
      EXPECT_TRUE(at::equal(value->toTensor(), at::full({3}, 2)));
      // A module on the joiner, trained through distributed autograd: the
      // forward goes w1 -> w2 -> w0 (mul_via) and the backward comes back.
      absl::StatusOr<RRef> module = remote(
          "w2", testing::kLinear, {int64_t{4}, int64_t{2}, int64_t{7}});
      ASSERT_THAT(module, IsOk());
      at::Generator gen = at::detail::createCPUGenerator(3);
      at::Tensor x = at::randn({3, 4}, gen).requires_grad_(true);
      at::Tensor w = at::randn({3, 2}, gen).requires_grad_(true);
      absl::StatusOr<autograd::Context> context = autograd::Context::enter();
      ASSERT_THAT(context, IsOk());
      absl::StatusOr<c10::IValue> y = module->rpc_sync().call("forward", {x});
      ASSERT_THAT(y, IsOk());
      absl::StatusOr<c10::IValue> z =
          rpc_sync("w2", testing::kMulVia, {std::string("w0"), y->toTensor(), w});
      ASSERT_THAT(z, IsOk());
      ASSERT_THAT(autograd::backward(context->id(), {z->toTensor().sum()}),
                  IsOk());
      absl::StatusOr<c10::IValue> g =
          module->rpc_sync().call("grads", {context->id()});
      ASSERT_THAT(g, IsOk());
      // The same computation, locally.
      at::Generator lgen = at::detail::createCPUGenerator(7);
      at::Tensor lweight = at::randn({2, 4}, lgen).requires_grad_(true);
      at::Tensor lbias = at::randn({2}, lgen).requires_grad_(true);
      at::Generator xgen = at::detail::createCPUGenerator(3);
      at::Tensor lx = at::randn({3, 4}, xgen).requires_grad_(true);
      at::Tensor lw = at::randn({3, 2}, xgen).requires_grad_(true);
      at::Tensor ly = at::addmm(lbias, lx, lweight.t());
      ((ly * 2 * lw) + ly).sum().backward();
      auto close = [](const at::Tensor& a, const at::Tensor& b) {
        return a.defined() && at::allclose(a, b, 1e-5, 1e-5);
      };
      EXPECT_TRUE(close(g->toTensorVector()[0], lweight.grad()));
      EXPECT_TRUE(close(g->toTensorVector()[1], lbias.grad()));
      absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> grads =
          autograd::get_gradients(context->id());
      ASSERT_THAT(grads, IsOk());
      auto gx = grads->find(x);
      ASSERT_TRUE(gx != grads->end());
      EXPECT_TRUE(close(gx->value(), lx.grad()));
      auto gw = grads->find(w);
      ASSERT_TRUE(gw != grads->end());
      EXPECT_TRUE(close(gw->value(), lw.grad()));
    }
    if (rank == 2) {
      store.set("w2_in");
      // Leaves after w1, which holds RRefs this worker owns until then.
      store.wait("w1_left");
    }
    // A leaver's shutdown returns once its RRef releases have reached their
    // owners: the owner's leak check at its own leave finds none.
    EXPECT_THAT(shutdown(), IsOk());
    if (rank == 1) store.set("w1_left");
    store.count("left", 2);
  });
}

}  // namespace
}  // namespace tether
