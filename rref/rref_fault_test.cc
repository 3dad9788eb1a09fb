// The RRef protocol under lost, failed and late messages: three workers in
// one process over the faulty backend (backends/faulty/faulty_agent.h)
// wrapping each real backend in turn (the test parameter). Control messages (RREF_USER_DELETE,
// RREF_FORK_REQUEST, RREF_CHILD_ACCEPT) are retried with backoff, so values
// stay right and every count returns to zero; a lost REMOTE_CALL is never
// retried and surfaces as the RRef's creation failure.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/builtin.h"
#include "core/rpc.h"
#include "rref/rref.h"
#include "rref/rref_impl.h"
#include "rref/rref_testing.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::kForward;
using ::tether::testing::kIsConfirmed;
using ::tether::testing::kMakeLocal;
using ::tether::testing::kRemoteAdd;
using ::tether::testing::kValueOf;
using ::tether::testing::StatusIs;

// How long one step may take before it counts as hung. User calls in this
// file pass it explicitly: the workers' default timeout is short in the drop
// tests, since it is what bounds a dropped control message.
constexpr absl::Duration kBound = absl::Seconds(30);

using Settings = absl::flat_hash_map<std::string, std::string>;

// Short, so that a dropped control message is retried quickly.
constexpr absl::Duration kControlTimeout = absl::Milliseconds(300);

class RRefFaults : public ::testing::TestWithParam<std::string> {
 protected:
  // Three workers over faulty(GetParam()) with `faults` (faulty.* settings);
  // `default_timeout` bounds control messages and unbounded calls.
  void start(Settings faults, absl::Duration default_timeout = kBound,
             RRefOptions rref_options = RRefOptions()) {
    static std::atomic<int> counter{0};
    BackendRegistry registry;
    ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
    RpcOptions options;
    options.backend = "faulty";
    options.init_method = absl::StrCat("memory://rref_fault_test_", counter++);
    // DeletionOfUsersRacingWithForks keeps up to 12 nested calls in flight,
    // each holding up to two pool threads of one worker while it waits.
    options.num_worker_threads = 32;
    options.default_timeout = default_timeout;
    options.shutdown_timeout = kBound;
    options.backend_settings = std::move(faults);
    options.backend_settings["faulty.inner"] = GetParam();
    workers_ = ::tether::testing::start_workers(
        registry, options, {"alice", "bob", "carol"}, rref_options);
    for (const auto& w : workers_) ASSERT_NE(w, nullptr);
  }

  void TearDown() override { ::tether::testing::shutdown_workers(workers_); }

  Worker& alice() { return *workers_[0]; }

  // Waits (bounded) until every worker's RRef counts are back to zero.
  void expect_all_released() {
    const absl::Time deadline = absl::Now() + kBound;
    for (auto& w : workers_) {
      Worker* worker = w.get();
      ::tether::testing::expect_released_by(
          worker->get_current_worker_info().name,
          [worker] { return rref_debug_info(*worker); }, deadline);
    }
  }

  // remote() on bob whose creation times out after `timeout` (its call lost
  // or late): the user learns it, and to_here() says the creation failed.
  RRef remote_that_times_out(absl::Duration timeout) {
    absl::StatusOr<RRef> r =
        remote(alice(), "bob", "aten::add.Tensor",
               {at::ones({2}), at::ones({2})}, {}, timeout);
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return RRef();
    // Wait for the timeout to reach the user.
    auto* user = dynamic_cast<rref::UserRRef*>(r->impl());
    EXPECT_NE(user, nullptr);
    if (user == nullptr) return RRef();
    EXPECT_THAT(user->confirmation().wait(absl::Now() + kBound), IsOk());
    EXPECT_FALSE(r->confirmed_by_owner());
    EXPECT_THAT(r->to_here(kBound),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         HasSubstr("RRef creation failed")));
    return *std::move(r);
  }

  absl::StatusOr<c10::IValue> call(const To& to, absl::string_view fn,
                                   std::vector<c10::IValue> args) {
    return alice().rpc_sync(to, fn, std::move(args), {}, kBound);
  }

  // Every kind of RRef traffic, each checked for its value: a user shared
  // with another user (who sees it confirmed) and with the owner, forwarded
  // through several workers, an RRef returned by its owner and a user
  // returned by the user that made it. Everything is dropped at the end.
  void exercise_every_path() {
    absl::StatusOr<RRef> r = remote(alice(), "bob", "aten::add.Tensor",
                                    {at::ones({2}), at::ones({2})}, {}, kBound);
    ASSERT_THAT(r, IsOk());
    absl::StatusOr<c10::IValue> confirmed = call("carol", kIsConfirmed, {*r});
    ASSERT_THAT(confirmed, IsOk());
    EXPECT_TRUE(confirmed->toBool());
    for (const char* to : {"carol", "bob", "alice"}) {
      absl::StatusOr<c10::IValue> v = call(to, kValueOf, {*r});
      ASSERT_THAT(v, IsOk()) << to;
      EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0))) << to;
    }
    std::vector<std::string> path = {"alice", "bob", "carol", "alice"};
    absl::StatusOr<c10::IValue> forwarded =
        call("carol", kForward, {*r, c10::IValue(path)});
    ASSERT_THAT(forwarded, IsOk());
    EXPECT_TRUE(at::equal(forwarded->toTensor(), at::full({2}, 2.0)));
    absl::StatusOr<c10::IValue> v = r->to_here(kBound);
    ASSERT_THAT(v, IsOk());
    EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0)));

    absl::StatusOr<c10::IValue> owned =
        call("carol", kMakeLocal, {at::ones({2})});
    ASSERT_THAT(owned, IsOk());
    absl::StatusOr<RRef> from_owner = RRef::from_ivalue(*owned);
    ASSERT_THAT(from_owner, IsOk());
    EXPECT_TRUE(from_owner->confirmed_by_owner());
    absl::StatusOr<c10::IValue> ten = from_owner->to_here(kBound);
    ASSERT_THAT(ten, IsOk());
    EXPECT_TRUE(at::equal(ten->toTensor(), at::full({2}, 10.0)));

    absl::StatusOr<c10::IValue> made =
        call("carol", kRemoteAdd,
             {c10::IValue(std::string("bob")), at::full({2}, 4.0)});
    ASSERT_THAT(made, IsOk());
    absl::StatusOr<RRef> from_user = RRef::from_ivalue(*made);
    ASSERT_THAT(from_user, IsOk());
    EXPECT_EQ(from_user->owner_name(), "bob");
    absl::StatusOr<c10::IValue> five = from_user->to_here(kBound);
    ASSERT_THAT(five, IsOk());
    EXPECT_TRUE(at::equal(five->toTensor(), at::full({2}, 5.0)));
  }

  std::vector<std::unique_ptr<Worker>> workers_;
};

constexpr char kEveryControlType[] =
    "RREF_USER_DELETE:2,RREF_FORK_REQUEST:2,RREF_CHILD_ACCEPT:2";

TEST_P(RRefFaults, NoFaultsBaseline) {
  ASSERT_NO_FATAL_FAILURE(start({}));
  exercise_every_path();
  expect_all_released();
}

TEST_P(RRefFaults, FailedControlMessagesAreRetried) {
  ASSERT_NO_FATAL_FAILURE(start({{"faulty.fail", kEveryControlType}}));
  exercise_every_path();
  expect_all_released();
}

TEST_P(RRefFaults, DroppedControlMessagesAreRetriedAfterTheirTimeout) {
  ASSERT_NO_FATAL_FAILURE(
      start({{"faulty.drop", kEveryControlType}}, kControlTimeout));
  exercise_every_path();
  expect_all_released();
}

TEST_P(RRefFaults, FailedAndDroppedControlMessagesTogether) {
  ASSERT_NO_FATAL_FAILURE(start({{"faulty.fail",
                                  "RREF_USER_DELETE:1,RREF_FORK_REQUEST:1,"
                                  "RREF_CHILD_ACCEPT:1"},
                                 {"faulty.drop",
                                  "RREF_USER_DELETE:1,RREF_FORK_REQUEST:1,"
                                  "RREF_CHILD_ACCEPT:1"}},
                                kControlTimeout));
  exercise_every_path();
  expect_all_released();
}

TEST_P(RRefFaults, DroppedUserDeleteStillReleasesTheOwner) {
  ASSERT_NO_FATAL_FAILURE(
      start({{"faulty.drop", "RREF_USER_DELETE:3"}}, kControlTimeout));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<RRef> r =
        remote(alice(), "bob", "aten::add.Tensor",
               {at::full({2}, double(i)), at::ones({2})}, {}, kBound);
    ASSERT_THAT(r, IsOk());
    absl::StatusOr<c10::IValue> v = r->to_here(kBound);
    ASSERT_THAT(v, IsOk());
    EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, i + 1.0)));
  }
  expect_all_released();
}

TEST_P(RRefFaults, DelayedForkRequestMakesTheChildWaitForConfirmation) {
  const absl::Duration delay = absl::Milliseconds(50);
  ASSERT_NO_FATAL_FAILURE(start({{"faulty.delay", "RREF_FORK_REQUEST:50"}}));
  absl::StatusOr<RRef> r = remote(alice(), "bob", "aten::add.Tensor",
                                  {at::ones({2}), at::ones({2})}, {}, kBound);
  ASSERT_THAT(r, IsOk());
  ASSERT_THAT(r->to_here(kBound), IsOk());  // alice is confirmed
  // carol's function runs only once the owner confirmed her fork, which
  // her delayed RREF_FORK_REQUEST holds back.
  const absl::Time start = absl::Now();
  absl::StatusOr<c10::IValue> confirmed = call("carol", kIsConfirmed, {*r});
  ASSERT_THAT(confirmed, IsOk());
  EXPECT_TRUE(confirmed->toBool());
  EXPECT_GE(absl::Now() - start, delay);
  // The parent lets go of its reference while the child still waits: the
  // pending child keeps the user alive until the owner has the fork.
  Future<c10::IValue> later =
      alice().rpc_async("carol", kValueOf, {*r}, {}, kBound);
  *r = RRef();
  absl::StatusOr<c10::IValue> v = later.get(absl::Now() + kBound);
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0)));
  exercise_every_path();
  expect_all_released();
}

TEST_P(RRefFaults, DelayedDeletesAndAcceptsStillReleaseEverything) {
  ASSERT_NO_FATAL_FAILURE(start(
      {{"faulty.delay",
        "RREF_USER_DELETE:30,RREF_CHILD_ACCEPT:30,RREF_FORK_REQUEST:10"}}));
  exercise_every_path();
  expect_all_released();
}

TEST_P(RRefFaults, DroppedRemoteCallReportsCreationFailureOnToHere) {
  ASSERT_NO_FATAL_FAILURE(start({{"faulty.drop", "REMOTE_CALL:1"}}));
  RRef r;
  ASSERT_NO_FATAL_FAILURE(r = remote_that_times_out(absl::Milliseconds(200)));
  // The next one is not dropped.
  absl::StatusOr<RRef> next =
      remote(alice(), "bob", "aten::add.Tensor", {at::ones({2}), at::ones({2})},
             {}, kBound);
  ASSERT_THAT(next, IsOk());
  absl::StatusOr<c10::IValue> v = next->to_here(kBound);
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0)));
  r = RRef();
  *next = RRef();
  expect_all_released();
}

TEST_P(RRefFaults, RemoteCallArrivingAfterItsTimeoutIsStillReleased) {
  // A timeout ends the caller's wait, not the delivery: the REMOTE_CALL
  // leaves 400 ms late, after its 100 ms timeout, and its owner is made
  // then. Dropping the user must still release it.
  ASSERT_NO_FATAL_FAILURE(start({{"faulty.delay", "REMOTE_CALL:400"}}));
  RRef r;
  ASSERT_NO_FATAL_FAILURE(r = remote_that_times_out(absl::Milliseconds(100)));
  // The owner appears on bob once the call arrives.
  Worker& bob = *workers_[1];
  auto owners_on_bob = [&bob]() -> int64_t {
    absl::StatusOr<RRefDebugInfo> info = rref_debug_info(bob);
    return info.ok() ? info->owners : -1;
  };
  const absl::Time deadline = absl::Now() + kBound;
  while (owners_on_bob() != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(owners_on_bob(), 1);
  r = RRef();
  expect_all_released();
}

TEST_P(RRefFaults, ToHereRacingADroppedRemoteCall) {
  // Regression: the owner once waited forever for the value of a fetch
  // that overtook a REMOTE_CALL which never came.
  ASSERT_NO_FATAL_FAILURE(start({{"faulty.drop", "REMOTE_CALL:1"}}));
  absl::StatusOr<RRef> r =
      remote(alice(), "bob", "aten::add.Tensor", {at::ones({2}), at::ones({2})},
             {}, absl::Milliseconds(200));
  ASSERT_THAT(r, IsOk());
  // The fetch reaches the owner before (in fact instead of) the call.
  EXPECT_THAT(r->to_here(absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("RRef creation failed")));
  *r = RRef();
  expect_all_released();
}

TEST_P(RRefFaults, LeakCheckNamesAnRRefWhoseUserNeverLeft) {
  RRefOptions leak_check;
  leak_check.leak_check = true;
  // Every RREF_USER_DELETE is lost, beyond what retries can mend.
  ASSERT_NO_FATAL_FAILURE(start({{"faulty.drop", "RREF_USER_DELETE:1000"}},
                                kControlTimeout, leak_check));
  absl::StatusOr<RRef> r = remote(alice(), "bob", "aten::add.Tensor",
                                  {at::ones({2}), at::ones({2})}, {}, kBound);
  ASSERT_THAT(r, IsOk());
  ASSERT_THAT(r->to_here(kBound), IsOk());
  *r = RRef();  // its deletion never reaches bob
  std::vector<absl::Status> results(workers_.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers_.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = workers_[i]->shutdown(); });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1],
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("leaked RRefs"),
                                        HasSubstr("'bob'"),
                                        HasSubstr("RRef 0:0 (users 0:1)"))));
  EXPECT_THAT(results[2], IsOk());
}

TEST_P(RRefFaults, DeletionOfUsersRacingWithForks) {
  ASSERT_NO_FATAL_FAILURE(
      start({{"faulty.delay", "RREF_FORK_REQUEST:5,RREF_CHILD_ACCEPT:3"},
             {"faulty.fail", "RREF_CHILD_ACCEPT:3,RREF_USER_DELETE:3"}}));
  absl::StatusOr<RRef> r =
      remote(alice(), "bob", "aten::add.Tensor",
             {at::ones({2}), at::full({2}, 2.0)}, {}, kBound);
  ASSERT_THAT(r, IsOk());
  constexpr int kThreads = 6;
  constexpr int kForks = 25;
  const std::vector<std::vector<std::string>> paths = {
      {}, {"alice"}, {"bob"}, {"carol", "alice"}};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Each thread starts with a copy of its own and drops it before its
    // last fork has been confirmed.
    threads.emplace_back([this, t, &paths, copy = *r]() mutable {
      std::vector<Future<c10::IValue>> calls;
      for (int i = 0; i < kForks; ++i) {
        RRef fork_of = copy;
        const char* to = (t + i) % 2 == 0 ? "carol" : "bob";
        calls.push_back(alice().rpc_async(
            to, kForward, {fork_of, c10::IValue(paths[(t + i) % paths.size()])},
            {}, kBound));
        if (i == kForks - 1) copy = RRef();
        // At most two calls of this thread in flight: nested calls block
        // pool threads, and the pools must not run dry.
        if (calls.size() >= 2) {
          absl::StatusOr<c10::IValue> v =
              calls.front().get(absl::Now() + kBound);
          calls.erase(calls.begin());
          ASSERT_THAT(v, IsOk());
          EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 3.0)));
        }
      }
      for (Future<c10::IValue>& c : calls) {
        absl::StatusOr<c10::IValue> v = c.get(absl::Now() + kBound);
        ASSERT_THAT(v, IsOk());
        EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 3.0)));
      }
    });
  }
  // The original goes while the threads fork their copies.
  *r = RRef();
  for (std::thread& thread : threads) thread.join();
  expect_all_released();
}

INSTANTIATE_TEST_SUITE_P(Backends, RRefFaults,
                         ::testing::Values("loopback", "tensorpipe", "grpc",
                                           "libfabric"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace tether
