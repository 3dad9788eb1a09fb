// Dynamic membership of Workers in one process over the loopback backend
// and a memory:// store: the Worker's side of joining and leaving (the
// protocol of core/join/membership.h, the MEMBER_JOIN / MEMBER_LEAVE
// messages, calls to joined and departed workers). The same runs across
// processes on every real backend in
// testing/scenarios/membership_scenarios_test.cc.
#include <ATen/ATen.h>
#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/builtin.h"
#include "core/rendezvous.h"
#include "core/worker.h"
#include "testing/status_matchers.h"
#include "testing/test_ops.h"

namespace tether {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

class DynamicGroup : public ::testing::Test {
 protected:
  DynamicGroup() {
    static std::atomic<int> counter{0};
    options_.backend = "loopback";
    options_.init_method = absl::StrCat("memory://membership_test_", counter++);
    options_.num_worker_threads = 4;
    options_.default_timeout = kBound;
    options_.init_timeout = kBound;
    options_.peer_timeout = absl::Seconds(2);
    EXPECT_THAT(backends::register_builtin_backends(registry_), IsOk());
  }

  absl::StatusOr<std::unique_ptr<Worker>> join(const std::string& name,
                                               int rank) {
    return Worker::create(name, rank, kDynamicGroup, options_, registry_);
  }

  std::unique_ptr<Worker> must_join(const std::string& name, int rank) {
    absl::StatusOr<std::unique_ptr<Worker>> worker = join(name, rank);
    EXPECT_THAT(worker, IsOk());
    return worker.ok() ? *std::move(worker) : nullptr;
  }

  static std::vector<std::string> names(const Worker& worker) {
    std::vector<std::string> out;
    for (const WorkerInfo& info : worker.get_all_worker_infos()) {
      out.push_back(absl::StrCat(info.id, ":", info.name));
    }
    return out;
  }

  RpcOptions options_;
  BackendRegistry registry_;
};

at::Tensor add_on(Worker& from, const std::string& to) {
  absl::StatusOr<c10::IValue> sum =
      from.rpc_sync(to, "aten::add.Tensor", {at::ones({2}), at::ones({2})});
  EXPECT_THAT(sum, IsOk());
  return sum.ok() ? sum->toTensor() : at::Tensor();
}

TEST_F(DynamicGroup, AJoinerSeesTheMembersAndTheyItWhenItsInitReturns) {
  std::unique_ptr<Worker> a = must_join("a", 0);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->is_dynamic());
  EXPECT_THAT(names(*a), ElementsAre("0:a"));
  // Ranks may have gaps.
  std::unique_ptr<Worker> c = must_join("c", 5);
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(names(*a), ElementsAre("0:a", "5:c"));
  EXPECT_THAT(names(*c), ElementsAre("0:a", "5:c"));
  EXPECT_TRUE(at::equal(add_on(*a, "c"), at::full({2}, 2)));
  EXPECT_TRUE(at::equal(add_on(*c, "a"), at::full({2}, 2)));
  absl::StatusOr<WorkerInfo> by_rank = a->get_worker_info(5);
  ASSERT_THAT(by_rank, IsOk());
  EXPECT_EQ(by_rank->name, "c");
  EXPECT_THAT(a->get_worker_info(3),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 3")));
  EXPECT_THAT(c->shutdown(), IsOk());
  EXPECT_THAT(a->shutdown(), IsOk());
}

TEST_F(DynamicGroup, CallsToALeaverFailFastNamingItAndTheNameIsFreeAgain) {
  std::unique_ptr<Worker> a = must_join("a", 0);
  std::unique_ptr<Worker> b = must_join("b", 1);
  ASSERT_NE(b, nullptr);
  ASSERT_THAT(b->shutdown(), IsOk());
  EXPECT_THAT(names(*a), ElementsAre("0:a"));
  const absl::Time start = absl::Now();
  EXPECT_THAT(a->rpc_sync("b", "aten::add.Tensor",
                          {at::ones({2}), at::ones({2})}),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker 'b' (rank 1) has left the group of "
                                 "worker 'a'")));
  EXPECT_THAT(a->rpc_sync(1, testing::kWhoami, {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("left")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_THAT(a->rpc_sync("nobody", testing::kWhoami, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("unknown worker 'nobody'")));
  // Name and rank were freed: the same worker may come back.
  b.reset();
  b = must_join("b", 1);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(at::equal(add_on(*a, "b"), at::full({2}, 2)));
  EXPECT_THAT(b->shutdown(), IsOk());
  EXPECT_THAT(a->shutdown(), IsOk());
}

TEST_F(DynamicGroup, ALeaveWaitsForTheCallsInFlightToTheLeaver) {
  std::unique_ptr<Worker> a = must_join("a", 0);
  std::unique_ptr<Worker> b = must_join("b", 1);
  ASSERT_NE(b, nullptr);
  std::vector<Future<c10::IValue>> slow;
  for (int i = 0; i < 4; ++i) {
    slow.push_back(a->rpc_async("b", testing::kSlow, {int64_t{300}}));
  }
  ASSERT_THAT(b->shutdown(), IsOk());
  // Every call that was in flight when b began to leave was served.
  for (Future<c10::IValue>& call : slow) {
    absl::StatusOr<c10::IValue> result = call.get(absl::Now() + kBound);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->toInt(), 300);
  }
  EXPECT_THAT(a->shutdown(), IsOk());
}

TEST_F(DynamicGroup, NamesAndRanksAreUnique) {
  std::unique_ptr<Worker> a = must_join("a", 0);
  EXPECT_THAT(join("a", 1), StatusIs(absl::StatusCode::kAlreadyExists,
                                     HasSubstr("'a' is already taken")));
  EXPECT_THAT(join("b", 0), StatusIs(absl::StatusCode::kAlreadyExists,
                                     HasSubstr("rank 0 is already taken")));
  // A refused joiner left nothing behind.
  std::unique_ptr<Worker> b = must_join("b", 1);
  ASSERT_NE(b, nullptr);
  EXPECT_THAT(names(*a), ElementsAre("0:a", "1:b"));
  EXPECT_THAT(b->shutdown(), IsOk());
  EXPECT_THAT(a->shutdown(), IsOk());
}

TEST_F(DynamicGroup, StaticAndDynamicWorkersDoNotMix) {
  std::unique_ptr<Worker> a = must_join("a", 0);
  EXPECT_THAT(Worker::create("s", 1, 2, options_, registry_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("mixes statically and dynamically")));
  EXPECT_THAT(a->shutdown(), IsOk());
}

TEST_F(DynamicGroup, MembershipMessagesAreChecked) {
  std::unique_ptr<Worker> a = must_join("a", 0);
  std::unique_ptr<Worker> b = must_join("b", 1);
  ASSERT_NE(b, nullptr);
  Message bad;
  bad.type = MessageType::kMemberJoin;
  bad.payload = "not a member line";
  EXPECT_THAT(a->send(b->get_current_worker_info(), bad).get(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("malformed MEMBER_JOIN"),
                             HasSubstr("'not a member line'"))));
  EXPECT_THAT(names(*b), ElementsAre("0:a", "1:b"));
  EXPECT_THAT(b->shutdown(), IsOk());
  EXPECT_THAT(a->shutdown(), IsOk());

  // A static group takes none.
  options_.init_method += "_static";
  std::vector<absl::StatusOr<std::unique_ptr<Worker>>> group(2);
  std::thread second([&] {
    group[1] = Worker::create("t1", 1, 2, options_, registry_);
  });
  group[0] = Worker::create("t0", 0, 2, options_, registry_);
  second.join();
  ASSERT_THAT(group[0], IsOk());
  ASSERT_THAT(group[1], IsOk());
  Message join_message;
  join_message.type = MessageType::kMemberJoin;
  join_message.payload = "7:x\n";
  EXPECT_THAT(
      (*group[0])->send((*group[1])->get_current_worker_info(), join_message)
          .get(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("static group")));
  std::thread leave([&] { EXPECT_THAT((*group[1])->shutdown(), IsOk()); });
  EXPECT_THAT((*group[0])->shutdown(), IsOk());
  leave.join();
}

TEST_F(DynamicGroup, JoinsAndLeavesDuringTraffic) {
  std::unique_ptr<Worker> a = must_join("a", 0);
  std::unique_ptr<Worker> b = must_join("b", 1);
  ASSERT_NE(b, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  // b calls a, and every other member it knows, without a pause.
  std::thread traffic([&] {
    while (!stop.load()) {
      for (const WorkerInfo& to : b->get_all_worker_infos()) {
        absl::StatusOr<c10::IValue> sum = b->rpc_sync(
            to, "aten::add.Tensor", {at::ones({2}), at::ones({2})});
        // A member that leaves meanwhile is refused, naming it; nothing
        // else may fail.
        if (!sum.ok()) {
          EXPECT_THAT(sum, StatusIs(absl::StatusCode::kUnavailable,
                                    AllOf(HasSubstr(to.name),
                                          HasSubstr("left the group"))));
        } else {
          ++calls;
        }
      }
    }
  });
  for (int cycle = 0; cycle < 5; ++cycle) {
    std::unique_ptr<Worker> c = must_join("c", 2);
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(at::equal(add_on(*c, "b"), at::full({2}, 2)));
    EXPECT_TRUE(at::equal(add_on(*a, "c"), at::full({2}, 2)));
    EXPECT_THAT(c->shutdown(), IsOk());
  }
  stop = true;
  traffic.join();
  EXPECT_GT(calls.load(), 0);
  EXPECT_THAT(b->shutdown(), IsOk());
  EXPECT_THAT(a->shutdown(), IsOk());
}

}  // namespace
}  // namespace tether
