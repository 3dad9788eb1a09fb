#include "core/future.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

TEST(Future, CompletesExactlyOnce) {
  Promise<int> promise;
  Future<int> future = promise.future();
  EXPECT_FALSE(future.is_ready());
  EXPECT_TRUE(promise.set(1));
  EXPECT_FALSE(promise.set(2));
  EXPECT_FALSE(promise.set(absl::InternalError("late")));
  ASSERT_THAT(future.get(), IsOk());
  EXPECT_EQ(*future.get(), 1);
}

TEST(Future, CallbackRunsOnceOnTheCompletingThread) {
  Promise<int> promise;
  std::atomic<int> runs{0};
  std::thread::id ran_on;
  promise.future().on_complete([&](const absl::StatusOr<int>& result) {
    ++runs;
    ran_on = std::this_thread::get_id();
    EXPECT_EQ(*result, 7);
  });
  std::thread completer([&] { promise.set(7); });
  std::thread::id completer_id = completer.get_id();
  completer.join();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(ran_on, completer_id);
}

TEST(Future, CallbackOnReadyFutureRunsAtOnce) {
  Future<int> future = Future<int>::ready(3);
  int seen = 0;
  future.on_complete([&](const absl::StatusOr<int>& result) { seen = *result; });
  EXPECT_EQ(seen, 3);
}

TEST(Future, ThenChainsValuesAndErrors) {
  Promise<int> promise;
  Future<std::string> text = promise.future().then(
      [](const absl::StatusOr<int>& r) -> absl::StatusOr<std::string> {
        if (!r.ok()) return r.status();
        return std::to_string(*r * 2);
      });
  promise.set(21);
  EXPECT_EQ(*text.get(), "42");

  Promise<int> failing;
  Future<std::string> failed = failing.future().then(
      [](const absl::StatusOr<int>& r) -> absl::StatusOr<std::string> {
        if (!r.ok()) return r.status();
        return std::string("unreachable");
      });
  failing.set(absl::UnavailableError("peer lost"));
  EXPECT_THAT(failed.get(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(Future, WaitHonoursItsDeadline) {
  Promise<int> promise;
  Future<int> future = promise.future();
  EXPECT_THAT(future.wait(absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(future.get(absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  promise.set(5);
  EXPECT_THAT(future.wait(absl::Now()), IsOk());
}

// RpcOptions::busy_poll makes waits poll before they sleep: a result that
// comes while polling, one that comes after, and a deadline that comes
// first all end the wait as without polling.
TEST(Future, PollingWaitsSeeResultsAndDeadlines) {
  struct Restore {
    ~Restore() { internal::reset_wait_polling(); }
  } restore;
  for (absl::Duration spin : {absl::Milliseconds(200), absl::Microseconds(50)}) {
    internal::reset_wait_polling();
    internal::poll_waits_with(PollPolicy{spin, false});
    Promise<int> promise;
    std::thread completer([promise]() mutable {
      absl::SleepFor(absl::Milliseconds(20));
      promise.set(7);
    });
    absl::StatusOr<int> value = promise.future().get();
    completer.join();
    ASSERT_THAT(value, IsOk());
    EXPECT_EQ(*value, 7);
    Promise<int> never;
    EXPECT_THAT(never.future().get(absl::Now() + absl::Milliseconds(30)),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
  }
  // The longest window any worker asked for, on spare cores only unless
  // one asked to poll regardless of the load.
  internal::reset_wait_polling();
  internal::poll_waits_with(PollPolicy{absl::Microseconds(10), true});
  internal::poll_waits_with(PollPolicy{absl::Microseconds(5), true});
  EXPECT_EQ(internal::wait_poll_policy().window, absl::Microseconds(10));
  EXPECT_TRUE(internal::wait_poll_policy().only_on_spare_cores);
  internal::poll_waits_with(PollPolicy{absl::Microseconds(5), false});
  EXPECT_EQ(internal::wait_poll_policy().window, absl::Microseconds(10));
  EXPECT_FALSE(internal::wait_poll_policy().only_on_spare_cores);
}

// A WaitAssist that only sleeps until woken (or 10 s), counting its calls.
class SleepingAssist final : public internal::WaitAssist {
 public:
  void wait(const std::atomic<bool>& done, absl::Time deadline) override {
    ++waits;
    absl::MutexLock lock(&mu_);
    auto woken_or_done = [this, &done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return woken_ || done.load();
    };
    mu_.AwaitWithDeadline(absl::Condition(&woken_or_done),
                          std::min(deadline, absl::Now() + absl::Seconds(10)));
  }
  void wake() override {
    absl::MutexLock lock(&mu_);
    woken_ = true;
    ++wakes;
  }
  void settle() override {
    absl::MutexLock lock(&mu_);
    woken_ = false;
    ++settles;
  }
  std::atomic<int> waits{0}, wakes{0}, settles{0};

 private:
  absl::Mutex mu_;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

// The next wait on the thread that armed an assist takes it; whoever
// completes the future wakes it.
TEST(Future, AnArmedAssistWaitsAndTheCompleterWakesIt) {
  SleepingAssist assist;
  Promise<int> promise;
  internal::wait_assist = &assist;
  std::thread completer([&] {
    while (assist.waits.load() == 0) std::this_thread::yield();
    promise.set(7);
  });
  const absl::Time started = absl::Now();
  absl::StatusOr<int> got = promise.future().get();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, 7);
  completer.join();
  EXPECT_EQ(assist.waits.load(), 1);
  EXPECT_EQ(assist.wakes.load(), 1);
  EXPECT_EQ(assist.settles.load(), 1);
  EXPECT_LT(absl::Now() - started, absl::Seconds(10));  // woken, not timed out
  EXPECT_EQ(internal::wait_assist, nullptr);  // taken
  // Not armed again: the next wait sleeps as usual.
  Promise<int> second;
  std::thread later([&] { second.set(8); });
  EXPECT_EQ(*second.future().get(), 8);
  later.join();
  EXPECT_EQ(assist.waits.load(), 1);
}

// A future already complete is not waited for through the assist.
TEST(Future, AnAssistIsNotUsedForACompleteFuture) {
  SleepingAssist assist;
  internal::wait_assist = &assist;
  EXPECT_EQ(*Future<int>::ready(3).get(), 3);
  EXPECT_EQ(assist.waits.load(), 0);
  internal::wait_assist = nullptr;
}

TEST(Future, ManyThreadsRaceToComplete) {
  for (int round = 0; round < 50; ++round) {
    Promise<int> promise;
    std::atomic<int> callbacks{0};
    promise.future().on_complete(
        [&](const absl::StatusOr<int>&) { ++callbacks; });
    std::atomic<int> winners{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        if (promise.set(t)) ++winners;
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(winners.load(), 1);
    EXPECT_EQ(callbacks.load(), 1);
  }
}

TEST(Future, CollectAllKeepsEveryResultInOrder) {
  Promise<int> a, b, c;
  Future<std::vector<absl::StatusOr<int>>> all =
      collect_all(std::vector<Future<int>>{a.future(), b.future(), c.future()});
  c.set(3);
  a.set(1);
  EXPECT_FALSE(all.is_ready());
  b.set(absl::NotFoundError("b failed"));
  ASSERT_TRUE(all.is_ready());
  ASSERT_THAT(all.result(), IsOk());
  const auto& results = *all.result();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(*results[0], 1);
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(*results[2], 3);
  EXPECT_TRUE(collect_all(std::vector<Future<int>>{}).is_ready());
}

TEST(Future, WaitAllGivesTheValuesOrTheFirstError) {
  std::vector<Promise<int>> promises(3);
  std::vector<Future<int>> futures;
  for (auto& p : promises) futures.push_back(p.future());
  std::thread completer([&] {
    for (int i = 2; i >= 0; --i) promises[i].set(i * 10);
  });
  absl::StatusOr<std::vector<int>> values = wait_all(futures);
  completer.join();
  ASSERT_THAT(values, IsOk());
  EXPECT_EQ(*values, (std::vector<int>{0, 10, 20}));

  Promise<int> ok, bad, worse;
  ok.set(1);
  bad.set(absl::UnavailableError("first"));
  worse.set(absl::InternalError("second"));
  EXPECT_THAT(wait_all(std::vector<Future<int>>{ok.future(), bad.future(),
                                                worse.future()}),
              StatusIs(absl::StatusCode::kUnavailable));
  Promise<int> never;
  EXPECT_THAT(wait_all(std::vector<Future<int>>{never.future()},
                       absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

}  // namespace
}  // namespace tether
