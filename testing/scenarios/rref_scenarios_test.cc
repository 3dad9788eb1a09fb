// RRef scenarios across real worker processes, on the backend named by the
// TETHER_TEST_BACKEND environment variable (set per cc_test in BUILD), so
// every backend runs the same scenarios: the RRef protocol first tested on
// loopback (rref/rref_test.cc), now with the wire, the codec and real
// concurrency in between.
//
// Each test body runs in 4 processes (testing/multiprocess.h) that meet
// through env://, serve RRefs (rref_extension()) and shut down gracefully at
// the end.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "backends/builtin.h"
#include "core/rpc.h"
#include "rref/rref.h"
#include "rref/rref_testing.h"
#include "testing/multiprocess.h"
#include "testing/scenario_backend.h"
#include "testing/status_matchers.h"

namespace {

// A remote object for the proxy scenario.
struct Counter : torch::CustomClassHolder {
  explicit Counter(int64_t start) : value(start) {}
  int64_t add(int64_t n) { return value += n; }
  at::Tensor scale(const at::Tensor& t) { return t * value; }
  int64_t value;
};

TORCH_LIBRARY(tether_rref_scenario, m) {
  m.class_<Counter>("Counter")
      .def(torch::init<int64_t>())
      .def("add", &Counter::add)
      .def("scale", &Counter::scale);
}

}  // namespace

namespace tether {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::kForward;
using ::tether::testing::kIsConfirmed;
using ::tether::testing::kMakeLocal;
using ::tether::testing::kRemoteAdd;
using ::tether::testing::kSumAll;
using ::tether::testing::kValueOf;
using ::tether::testing::StatusIs;
using ::tether::testing::backend_under_test;

constexpr int kWorld = 4;
constexpr absl::Duration kBound = ::tether::testing::kRRefOpTimeout;

// init_rpc over env:// as a launched worker would, named "w<rank>", serving
// RRefs.
void init(int rank, int world_size, absl::Duration default_timeout = kBound) {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry;
    EXPECT_THAT(backends::register_builtin_backends(*r), IsOk());
    return r;
  }();
  RpcOptions options;
  options.backend = backend_under_test();
  options.backend_settings = ::tether::testing::backend_settings_under_test();
  options.init_method = "env://";
  // Nested calls hold a pool thread per hop while they wait.
  options.num_worker_threads = 16;
  options.default_timeout = default_timeout;
  ASSERT_THAT(init_rpc(absl::StrCat("w", rank), rank, world_size, options,
                       *registry, {rref_extension()}),
              IsOk());
}

std::string name_of(int rank) { return absl::StrCat("w", rank % kWorld); }

absl::StatusOr<c10::IValue> call(const std::string& to, absl::string_view fn,
                                 std::vector<c10::IValue> args) {
  return rpc_sync(to, fn, std::move(args), {}, kBound);
}

at::Tensor twos() { return at::full({2}, 2.0); }

// Polls (bounded by `bound`) every worker's RRef counts until all are zero:
// this worker's own directly, the others' through debug_counts().
void expect_all_released(int world, absl::Duration bound = kBound) {
  const absl::Time deadline = absl::Now() + bound;
  Worker& self = *current_worker();
  for (int rank = 0; rank < world; ++rank) {
    const std::string worker = name_of(rank);
    const bool mine = rank == self.get_current_worker_info().id;
    ::tether::testing::expect_released_by(
        worker,
        [&self, &worker, mine]() -> absl::StatusOr<RRefDebugInfo> {
          if (mine) return rref_debug_info(self);
          return ::tether::testing::remote_debug_info(self, worker);
        },
        deadline);
  }
}

TEST(RRefScenarios, RemoteThenToHere) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    const std::string next = name_of(rank + 1);
    at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3}) + rank;
    {
      absl::StatusOr<RRef> r = remote(next, "aten::add.Tensor", {a, a});
      ASSERT_THAT(r, IsOk());
      EXPECT_FALSE(r->is_owner());
      EXPECT_EQ(r->owner_name(), next);
      absl::StatusOr<c10::IValue> v = r->to_here();
      ASSERT_THAT(v, IsOk());
      EXPECT_TRUE(at::equal(v->toTensor(), a * 2));
      // (confirmed_by_owner() may still be false here: the value can come
      // back before the REMOTE_CALL's acknowledgement.)
      EXPECT_THAT(r->local_value(),
                  StatusIs(absl::StatusCode::kFailedPrecondition));
      absl::StatusOr<RRef> bad = remote(next, "aten::no_such_op", {a});
      ASSERT_THAT(bad, IsOk());
      EXPECT_THAT(bad->to_here(), StatusIs(absl::StatusCode::kNotFound,
                                           HasSubstr("RRef creation failed")));
    }
    expect_all_released(world);
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(RRefScenarios, RemoteToSelfIsAnOwner) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    {
      absl::StatusOr<RRef> r = remote(name_of(rank), "aten::mul.Tensor",
                                      {at::full({2}, 3.0), twos()});
      ASSERT_THAT(r, IsOk());
      EXPECT_TRUE(r->is_owner());
      EXPECT_TRUE(r->confirmed_by_owner());
      absl::StatusOr<c10::IValue> v = r->to_here();
      ASSERT_THAT(v, IsOk());
      EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 6.0)));
      absl::StatusOr<c10::IValue> local = r->local_value();
      ASSERT_THAT(local, IsOk());
      EXPECT_TRUE(at::equal(local->toTensor(), at::full({2}, 6.0)));
      // The owner shares it: the peer reads it back from here.
      absl::StatusOr<c10::IValue> read =
          call(name_of(rank + 1), kValueOf, {*r});
      ASSERT_THAT(read, IsOk());
      EXPECT_TRUE(at::equal(read->toTensor(), at::full({2}, 6.0)));
    }
    expect_all_released(world);
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// An RRef owned by rank+1 goes through eight nested calls of `forward` (an
// operator of rref/rref_testing.h): the first to rank+2, then seven hops,
// visiting every process (the owner and this one too) twice; the last one
// fetches it. `timeout` bounds the first call (kDefaultTimeout: the default).
void forward_through_eight_calls(int rank, const char* forward,
                                 absl::Duration timeout) {
  absl::StatusOr<RRef> r = remote(name_of(rank + 1), "aten::add.Tensor",
                                  {at::ones({2}), at::full({2}, 6.0 + rank)});
  ASSERT_THAT(r, IsOk());
  std::vector<std::string> path;
  for (int hop = 3; hop < 10; ++hop) path.push_back(name_of(rank + hop));
  absl::StatusOr<c10::IValue> v = rpc_sync(
      name_of(rank + 2), forward, {*r, c10::IValue(path)}, {}, timeout);
  ASSERT_THAT(v, IsOk()) << absl::StrJoin(path, " -> ");
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 7.0 + rank)));
}

TEST(RRefScenarios, ForwardedThroughEightNestedCalls) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    forward_through_eight_calls(rank, kForward, kBound);
    expect_all_released(world);
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// The same with every call and the last one's fetch on the default timeout
// (ten minutes here): once every handle is dropped, the owners let go
// within 20 s, not when a call or the fetch could have timed out.
TEST(RRefScenarios, ChainOfUsersIsReleasedPromptlyWhateverTheTimeout) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world, absl::Minutes(10));
    forward_through_eight_calls(rank, ::tether::testing::kForwardDefault,
                                kDefaultTimeout);
    expect_all_released(world, absl::Seconds(20));
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(RRefScenarios, UserSharesWithAnotherUserWhoSeesItConfirmed) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    {
      absl::StatusOr<RRef> r =
          remote(name_of(rank + 1), "aten::add.Tensor", {twos(), twos()});
      ASSERT_THAT(r, IsOk());
      // rank+2 receives a fork from this user: it runs only once the owner
      // (rank+1) has confirmed it.
      const std::string third = name_of(rank + 2);
      absl::StatusOr<c10::IValue> confirmed = call(third, kIsConfirmed, {*r});
      ASSERT_THAT(confirmed, IsOk());
      EXPECT_TRUE(confirmed->toBool());
      absl::StatusOr<c10::IValue> v = call(third, kValueOf, {*r});
      ASSERT_THAT(v, IsOk());
      EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 4.0)));
      // And back to its owner.
      absl::StatusOr<c10::IValue> at_owner =
          call(name_of(rank + 1), kValueOf, {*r});
      ASSERT_THAT(at_owner, IsOk());
      EXPECT_TRUE(at::equal(at_owner->toTensor(), at::full({2}, 4.0)));
    }
    expect_all_released(world);
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(RRefScenarios, ReturnedRRefs) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    {
      // Returned by its owner: confirmed on arrival.
      absl::StatusOr<c10::IValue> owned =
          call(name_of(rank + 1), kMakeLocal, {at::ones({2})});
      ASSERT_THAT(owned, IsOk());
      absl::StatusOr<RRef> from_owner = RRef::from_ivalue(*owned);
      ASSERT_THAT(from_owner, IsOk());
      EXPECT_EQ(from_owner->owner_name(), name_of(rank + 1));
      EXPECT_TRUE(from_owner->confirmed_by_owner());
      absl::StatusOr<c10::IValue> ten = from_owner->to_here();
      ASSERT_THAT(ten, IsOk());
      EXPECT_TRUE(at::equal(ten->toTensor(), at::full({2}, 10.0)));

      // Returned by a user (rank+1) of an RRef owned by rank+2.
      absl::StatusOr<c10::IValue> made =
          call(name_of(rank + 1), kRemoteAdd,
               {c10::IValue(name_of(rank + 2)), at::full({2}, 4.0)});
      ASSERT_THAT(made, IsOk());
      absl::StatusOr<RRef> from_user = RRef::from_ivalue(*made);
      ASSERT_THAT(from_user, IsOk());
      EXPECT_EQ(from_user->owner_name(), name_of(rank + 2));
      absl::StatusOr<c10::IValue> five = from_user->to_here();
      ASSERT_THAT(five, IsOk());
      EXPECT_TRUE(at::equal(five->toTensor(), at::full({2}, 5.0)));

      // Returned by a user made here, owned by this process.
      absl::StatusOr<c10::IValue> mine =
          call(name_of(rank + 3), kRemoteAdd,
               {c10::IValue(name_of(rank)), at::full({2}, 8.0)});
      ASSERT_THAT(mine, IsOk());
      absl::StatusOr<RRef> own = RRef::from_ivalue(*mine);
      ASSERT_THAT(own, IsOk());
      EXPECT_TRUE(own->is_owner());
      absl::StatusOr<c10::IValue> nine = own->local_value();
      ASSERT_THAT(nine, IsOk());
      EXPECT_TRUE(at::equal(nine->toTensor(), at::full({2}, 9.0)));
    }
    expect_all_released(world);
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(RRefScenarios, RRefsInsideLists) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    {
      std::vector<RRef> refs;
      c10::impl::GenericList list(c10::AnyType::get());
      for (int i = 0; i < 6; ++i) {
        // Owned by every process, this one included.
        absl::StatusOr<RRef> r =
            remote(name_of(rank + i), "aten::add.Tensor",
                   {at::full({2}, double(i)), at::ones({2})});
        ASSERT_THAT(r, IsOk());
        refs.push_back(*r);
        list.push_back(r->to_ivalue());
      }
      absl::StatusOr<c10::IValue> v =
          call(name_of(rank + 1), kSumAll, {c10::IValue(list)});
      ASSERT_THAT(v, IsOk());
      EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 21.0)));
    }
    expect_all_released(world);
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(RRefScenarios, LocalRRefsPassedToOtherProcesses) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    {
      absl::StatusOr<RRef> mine = RRef::local(at::full({2}, double(rank)));
      ASSERT_THAT(mine, IsOk());
      for (int hop = 1; hop < world; ++hop) {
        absl::StatusOr<c10::IValue> v =
            call(name_of(rank + hop), ::tether::testing::kValueOf, {*mine});
        ASSERT_THAT(v, IsOk());
        EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, double(rank))));
      }
    }
    expect_all_released(world);
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// 4 processes x 4 threads x 63: about a thousand RRefs in all.
TEST(RRefScenarios, ThousandCreatedAndDroppedConcurrently) {
  ::tether::testing::run_in_processes(
      kWorld,
      [](int rank, int world) {
        init(rank, world);
        constexpr int kThreads = 4;
        constexpr int kPerThread = 63;
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
          threads.emplace_back([rank, t] {
            for (int i = 0; i < kPerThread; ++i) {
              absl::StatusOr<RRef> r =
                  remote(name_of(rank + 1 + (t + i) % (kWorld - 1)),
                         "aten::add.Tensor",
                         {at::full({2}, double(i)), at::ones({2})});
              ASSERT_THAT(r, IsOk());
              if (i % 10 == 0) {
                absl::StatusOr<c10::IValue> v = r->to_here();
                ASSERT_THAT(v, IsOk());
                EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, i + 1.0)));
              }
            }
          });
        }
        for (std::thread& thread : threads) thread.join();
        // Every RRef made here is gone: the owners' counts (and everyone's
        // pending ones) come back to zero before the shutdown. Peers still
        // creating theirs only make the wait longer.
        expect_all_released(world);
        EXPECT_THAT(shutdown(), IsOk());
      },
      absl::Seconds(180));
}

TEST(RRefScenarios, ProxiesDriveARemoteObject) {
  ::tether::testing::run_in_processes(kWorld, [](int rank, int world) {
    init(rank, world);
    {
      absl::StatusOr<RRef> counter =
          remote(name_of(rank + 1),
                 "__torch__.torch.classes.tether_rref_scenario.Counter",
                 {int64_t{rank}});
      ASSERT_THAT(counter, IsOk());
      absl::StatusOr<c10::IValue> one =
          counter->rpc_sync().call("add", {int64_t{1}});
      ASSERT_THAT(one, IsOk());
      EXPECT_EQ(one->toInt(), rank + 1);
      absl::StatusOr<c10::IValue> two =
          counter->rpc_async().call("add", {int64_t{1}}).get();
      ASSERT_THAT(two, IsOk());
      EXPECT_EQ(two->toInt(), rank + 2);
      absl::StatusOr<RRef> scaled =
          counter->remote().call("scale", {at::ones({2})});
      ASSERT_THAT(scaled, IsOk());
      absl::StatusOr<c10::IValue> v = scaled->to_here();
      ASSERT_THAT(v, IsOk());
      EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, double(rank + 2))));
      EXPECT_THAT(counter->rpc_sync().call("no_such_method"),
                  StatusIs(absl::StatusCode::kNotFound,
                           HasSubstr("no_such_method")));
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

}  // namespace
}  // namespace tether
