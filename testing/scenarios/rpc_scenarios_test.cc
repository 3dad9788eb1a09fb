// RPC scenarios across real worker processes, on the backend named by the
// TETHER_TEST_BACKEND environment variable (set per cc_test in BUILD), so
// every backend runs the same scenarios instead of a copy of them.
//
// Each test body runs in 4 processes (testing/multiprocess.h) that meet
// through env:// and shut down gracefully at the end.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "backends/builtin.h"
#include "core/rpc.h"
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

constexpr int kWorld = 4;

// init_rpc over env:// as a launched worker would, named "w<rank>".
void init(int rank, int world_size,
          const wire::Limits& limits = wire::Limits(),
          absl::Duration busy_poll = absl::ZeroDuration()) {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry;
    EXPECT_THAT(backends::register_builtin_backends(*r), IsOk());
    return r;
  }();
  RpcOptions options;
  options.backend = backend_under_test();
  options.backend_settings = ::tether::testing::backend_settings_under_test();
  options.init_method = "env://";
  options.num_worker_threads = 8;
  options.default_timeout = absl::Seconds(60);
  options.scripts = {"def twice(x: Tensor) -> Tensor:\n    return x * 2\n"};
  options.limits = limits;
  options.busy_poll = busy_poll;
  ASSERT_THAT(init_rpc(absl::StrCat("w", rank), rank, world_size, options,
                       *registry),
              IsOk());
}

std::string name_of(int rank) { return absl::StrCat("w", rank); }

TEST(Scenarios, CallsOfEveryKind) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    const std::string next = name_of((rank + 1) % world);
    const std::string after = name_of((rank + 2) % world);
    at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3}) + rank;
    at::Tensor b = at::ones({2, 3});
    absl::StatusOr<c10::IValue> sum = rpc_sync(next, "aten::add.Tensor", {a, b});
    ASSERT_THAT(sum, IsOk());
    EXPECT_TRUE(at::equal(sum->toTensor(), a + b));
    absl::StatusOr<c10::IValue> scaled =
        rpc_sync(next, "tether_test::scale", {a, 3.0});
    ASSERT_THAT(scaled, IsOk());
    EXPECT_TRUE(at::allclose(scaled->toTensor(), a * 3));
    EXPECT_THAT(rpc_sync(name_of(rank), "aten::mul.Tensor", {a, b}), IsOk());
    absl::StatusOr<c10::IValue> nested = rpc_sync(
        next, "tether_test::add_via", {after, a, b});
    ASSERT_THAT(nested, IsOk());
    EXPECT_TRUE(at::equal(nested->toTensor(), a + b));
    // Compiled at init (RpcOptions::scripts), so callable at once.
    absl::StatusOr<c10::IValue> twice = rpc_sync(next, "twice", {a});
    ASSERT_THAT(twice, IsOk());
    EXPECT_TRUE(at::equal(twice->toTensor(), a * 2));
    EXPECT_THAT(rpc_sync(next, "aten::no_such_op", {a}),
                StatusIs(absl::StatusCode::kNotFound,
                         AllOf(HasSubstr("aten::no_such_op"), HasSubstr(next))));
    EXPECT_THAT(rpc_sync(next, "tether_test::scale",
                         {a, std::string("x")}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("factor")));
    EXPECT_THAT(rpc_sync(next, "tether_test::fail", {a}),
                StatusIs(absl::StatusCode::kUnknown,
                         AllOf(HasSubstr(next), HasSubstr("tether_test::fail"),
                               HasSubstr("fail was asked to fail"))));
    EXPECT_THAT(rpc_sync(next, "tether_test::slow", {int64_t{2000}}, {},
                         absl::Milliseconds(200)),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_THAT(rpc_sync("nobody", "aten::add.Tensor", {a, b}),
                StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// Nesting is one limit checked alike by sender and callee, across
// processes: w0 allows 256, w1 the default 64. A call's argument sits 2
// deep (the call tuple, the args tuple).
TEST(Scenarios, NestingOverTheLimitIsResourceExhaustedOnBothSides) {
  ::tether::testing::run_in_processes(2, [](int rank, int world) {
    wire::Limits limits;
    if (rank == 0) limits.max_depth = wire::kMaxSupportedDepth;
    init(rank, world, limits);
    const auto kExhausted = absl::StatusCode::kResourceExhausted;
    const std::string peer = name_of(1 - rank);
    absl::StatusOr<c10::IValue> within =
        rpc_sync(peer, testing::kNesting, {testing::nested_lists(62)});
    ASSERT_THAT(within, IsOk());
    EXPECT_EQ(within->toInt(), 62);
    if (rank == 1) {
      // Refused here, before it leaves.
      EXPECT_THAT(rpc_sync(peer, testing::kNesting, {testing::nested_lists(63)}),
                  StatusIs(kExhausted, AllOf(HasSubstr("deeper than 64"),
                                             HasSubstr("max_depth"))));
    } else {
      // Refused by the callee, whatever the depth (200 was INVALID_ARGUMENT).
      for (int depth : {63, 200, wire::kMaxSupportedDepth - 2}) {
        EXPECT_THAT(rpc_sync(peer, testing::kNesting, {testing::nested_lists(depth)}),
                    StatusIs(kExhausted, AllOf(HasSubstr("Error on worker 1"),
                                               HasSubstr("deeper than 64"),
                                               HasSubstr("max_depth"))))
            << depth;
      }
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// RpcOptions::busy_poll: the backend's waiting thread and the callers'
// waits poll before they sleep; calls, nested calls, many in flight and a
// timeout behave as without it.
TEST(Scenarios, CallsWhileBusyPolling) {
  ::tether::testing::run_in_processes(2, [](int rank, int world) {
    init(rank, world, wire::Limits(), absl::Microseconds(200));
    const std::string peer = name_of(1 - rank);
    at::Tensor a = at::arange(4, at::kFloat) + rank;
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<c10::IValue> sum =
          rpc_sync(peer, "aten::add.Scalar", {a, static_cast<double>(i)});
      ASSERT_THAT(sum, IsOk());
      ASSERT_TRUE(at::equal(sum->toTensor(), a + i));
    }
    std::vector<Future<c10::IValue>> futures;
    for (int i = 0; i < 100; ++i) {
      futures.push_back(rpc_async(peer, "aten::add.Scalar",
                                  {a, static_cast<double>(i)}));
    }
    for (int i = 0; i < 100; ++i) {
      absl::StatusOr<c10::IValue> sum = futures[i].get();
      ASSERT_THAT(sum, IsOk());
      EXPECT_TRUE(at::equal(sum->toTensor(), a + i));
    }
    absl::StatusOr<c10::IValue> nested =
        rpc_sync(peer, "tether_test::add_via", {name_of(rank), a, a});
    ASSERT_THAT(nested, IsOk());
    EXPECT_TRUE(at::equal(nested->toTensor(), a + a));
    EXPECT_THAT(rpc_sync(peer, "tether_test::slow", {int64_t{2000}}, {},
                         absl::Milliseconds(200)),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(Scenarios, RingOfThousandAsyncCalls) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    const std::string next = name_of((rank + 1) % world);
    std::vector<Future<c10::IValue>> futures;
    for (int i = 0; i < 1000; ++i) {
      futures.push_back(rpc_async(next, "aten::add.Tensor",
                                  {at::full({2}, double(i)), at::ones({2})}));
    }
    for (int i = 0; i < 1000; ++i) {
      absl::StatusOr<c10::IValue> r = futures[i].get();
      ASSERT_THAT(r, IsOk()) << "call " << i;
      EXPECT_EQ(r->toTensor()[1].item<double>(), i + 1.0);
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(Scenarios, TensorsOfManySizes) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    const std::string next = name_of((rank + 1) % world);
    for (int i = 0; i < 20; ++i) {
      at::Tensor x = at::randn({100, 100});
      absl::StatusOr<c10::IValue> y =
          rpc_sync(next, "tether_test::identity", {x});
      ASSERT_THAT(y, IsOk());
      EXPECT_TRUE(at::equal(y->toTensor(), x));
    }
    if (rank == 0) {
      at::Tensor big = at::arange(int64_t{64} << 20, at::kInt);  // 256 MiB
      absl::StatusOr<c10::IValue> back =
          rpc_sync(next, "tether_test::identity", {big});
      ASSERT_THAT(back, IsOk());
      EXPECT_TRUE(at::equal(back->toTensor(), big));
    }
    EXPECT_THAT(shutdown(), IsOk());
  }, absl::Seconds(240));
}

TEST(Scenarios, GracefulShutdownDrainsADetachedChain) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    if (rank == 0) {
      // Returns after the first hop; 19 more run while everyone shuts down.
      absl::StatusOr<c10::IValue> first =
          rpc_sync(name_of(1), "tether_test::chain", {int64_t{20}});
      ASSERT_THAT(first, IsOk());
      EXPECT_EQ(first->toInt(), 20);
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(Scenarios, UnevenWorkloadIsDrainedBeforeShutdown) {
  ::tether::testing::run_in_processes(3, [](int rank, int world) {
    init(rank, world);
    if (rank == 0) {
      // Load worker 1 first, then worker 2 with slow calls still running
      // when everyone reaches shutdown: worker 2 must not stop early.
      std::vector<Future<c10::IValue>> calls;
      for (int i = 0; i < 50; ++i) {
        calls.push_back(rpc_async(name_of(1), "aten::add.Tensor",
                                  {at::ones({8}), at::ones({8})}));
      }
      for (auto& call : calls) ASSERT_THAT(call.get(), IsOk());
      calls.clear();
      for (int i = 0; i < 4; ++i) {
        calls.push_back(
            rpc_async(name_of(2), "tether_test::slow", {int64_t{500}}));
      }
      EXPECT_THAT(shutdown(), IsOk());
      for (auto& call : calls) {
        absl::StatusOr<c10::IValue> r = call.get();
        ASSERT_THAT(r, IsOk());
        EXPECT_EQ(r->toInt(), 500);
      }
      return;
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// Functions that answer later (core/ivalue_future.h) chain across
// processes: w0 calls w1's relay, which calls w2's relay, which calls w3's
// add and hands back that future; each hop holds no thread while it waits.
TEST(Scenarios, AsyncFunctionsChainAcrossProcesses) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    Worker* self = current_worker();
    ASSERT_NE(self, nullptr);
    ASSERT_THAT(self->register_function(
                    "relay",
                    [world](int64_t hop, at::Tensor x) -> Future<c10::IValue> {
                      if (hop + 1 == world - 1) {
                        return rpc_async(name_of(hop + 1), "aten::add", {x, 1});
                      }
                      return rpc_async(name_of(hop + 1), "relay", {hop + 1, x});
                    }),
                IsOk());
    ASSERT_THAT(barrier(), IsOk());  // every relay is registered
    if (rank == 0) {
      std::vector<Future<c10::IValue>> calls;
      for (int i = 0; i < 32; ++i) {
        calls.push_back(rpc_async(name_of(1), "relay",
                                  {int64_t{1}, at::full({2}, double(i))}));
      }
      absl::StatusOr<std::vector<c10::IValue>> all =
          wait_all(calls, absl::Now() + absl::Seconds(60));
      ASSERT_THAT(all, IsOk());
      for (int i = 0; i < 32; ++i) {
        EXPECT_TRUE(at::equal((*all)[i].toTensor(), at::full({2}, i + 1.0)));
      }
      EXPECT_THAT(rpc_sync(name_of(1), "relay",
                           {int64_t{1}, std::string("not a tensor")}),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr("w1"), HasSubstr("relay"))));
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// all_gather and barrier over subsets of the group (core/collective.cc),
// and a member killed while another waits for it: the loss ends the wait.
TEST(Scenarios, SubsetCollectivesEndWhenAMemberIsLost) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    // Two pairs gather at once: {w0, w2} and {w1, w3}.
    absl::StatusOr<std::map<std::string, c10::IValue>> got =
        all_gather(at::full({2}, static_cast<double>(rank)),
                   {name_of(rank % 2), name_of(rank % 2 + 2)});
    ASSERT_THAT(got, IsOk());
    ASSERT_EQ(got->size(), 2u);
    const int partner = (rank + 2) % world;
    EXPECT_TRUE(at::equal(got->at(name_of(partner)).toTensor(),
                          at::full({2}, static_cast<double>(partner))));
    ASSERT_THAT(barrier(), IsOk());  // the whole group
    if (rank == 3) ::kill(::getpid(), SIGKILL);
    if (rank == 1) {
      const absl::Time start = absl::Now();
      EXPECT_THAT(barrier({name_of(1), name_of(3)}),
                  StatusIs(absl::StatusCode::kUnavailable, HasSubstr("w3")));
      EXPECT_LT(absl::Now() - start, absl::Seconds(30));
    }
    ASSERT_THAT(barrier({name_of(0), name_of(1), name_of(2)}), IsOk());
    // The group lost a member: the survivors stop without the barrier.
    EXPECT_THAT(shutdown(/*graceful=*/false), IsOk());
  }, absl::Seconds(120), /*may_die=*/{3});
}

TEST(Scenarios, KilledWorkerFailsCallsInBoundedTime) {
  ::tether::testing::run_in_processes(3, [](int rank, int world) {
    init(rank, world);
    if (rank == 1) {
      // Dies mid-call, holding a call from rank 0.
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(::getpid(), SIGKILL);
      }).detach();
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return;
    }
    if (rank == 0) {
      absl::Time start = absl::Now();
      absl::StatusOr<c10::IValue> r = rpc_sync(
          name_of(1), "tether_test::slow", {int64_t{30000}});
      absl::Duration took = absl::Now() - start;
      EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("w1")));
      // The call began ~300 ms before the kill; the loss shows at once.
      EXPECT_LT(took, absl::Seconds(5));
      std::printf("call to the killed worker failed after %s\n",
                  absl::FormatDuration(took).c_str());
      // Later calls to it fail fast too; the survivors keep working.
      EXPECT_THAT(rpc_sync(name_of(1), "aten::add.Tensor",
                           {at::ones({2}), at::ones({2})}),
                  StatusIs(absl::StatusCode::kUnavailable));
      absl::StatusOr<c10::IValue> alive = rpc_sync(
          name_of(2), "aten::add.Tensor", {at::ones({2}), at::ones({2})});
      ASSERT_THAT(alive, IsOk());
      // Tell rank 2 it may stop: it serves until this call. It may stop
      // before its answer leaves, so a lost connection is fine here.
      absl::StatusOr<c10::IValue> told =
          rpc_sync(name_of(2), "tether_test::release", {});
      EXPECT_TRUE(told.ok() ||
                  told.status().code() == absl::StatusCode::kUnavailable)
          << told.status();
    } else {
      EXPECT_TRUE(::tether::testing::wait_for_release(absl::Seconds(60)));
    }
    // The group lost a member: the survivors stop without the barrier.
    EXPECT_THAT(shutdown(/*graceful=*/false), IsOk());
  }, absl::Seconds(120), /*may_die=*/{1});
}

}  // namespace
}  // namespace tether
