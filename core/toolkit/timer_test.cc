#include "core/toolkit/timer.h"

#include <gtest/gtest.h>

#include <atomic>

#include "core/future.h"

namespace tether::internal {
namespace {

TEST(TimerQueue, RunsAtTheDeadlineInOrder) {
  TimerQueue timers;
  Promise<int> second;
  std::vector<int> order;
  absl::Mutex mu;
  // Deadlines far enough out that both are scheduled before either is due,
  // even on a slow (sanitized, loaded) run.
  absl::Time start = absl::Now();
  timers.schedule(start + absl::Milliseconds(600), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(2);
    second.set(0);
  });
  timers.schedule(start + absl::Milliseconds(300), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(1);
  });
  ASSERT_TRUE(second.future().get(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(600));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(TimerQueue, EarlierTimerAddedWhileWaitingFiresFirst) {
  TimerQueue timers;
  Promise<int> fired;
  timers.schedule(absl::Now() + absl::Seconds(30), [] {});
  absl::Time start = absl::Now();
  timers.schedule(absl::Now() + absl::Milliseconds(10), [&] { fired.set(1); });
  ASSERT_TRUE(fired.future().get(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(TimerQueue, CancelledTimerDoesNotRun) {
  TimerQueue timers;
  std::atomic<bool> ran{false};
  TimerQueue::Id id =
      timers.schedule(absl::Now() + absl::Milliseconds(30), [&] { ran = true; });
  EXPECT_TRUE(timers.cancel(id));
  EXPECT_FALSE(timers.cancel(id));
  Promise<int> later;
  timers.schedule(absl::Now() + absl::Milliseconds(60), [&] { later.set(1); });
  ASSERT_TRUE(later.future().get(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_FALSE(ran.load());
}

// The thread sleeps until the earliest deadline it saw, even after that
// timer is cancelled; a later timer must still run, and an earlier one
// must still wake it.
TEST(TimerQueue, TimersAfterACancelledOneStillRunOnTime) {
  TimerQueue timers;
  TimerQueue::Id far = timers.schedule(absl::Now() + absl::Seconds(30), [] {});
  absl::SleepFor(absl::Milliseconds(20));  // the thread now sleeps until it
  EXPECT_TRUE(timers.cancel(far));
  Promise<int> sooner;
  absl::Time start = absl::Now();
  timers.schedule(absl::Now() + absl::Milliseconds(10), [&] { sooner.set(1); });
  ASSERT_TRUE(sooner.future().get(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  TimerQueue::Id near =
      timers.schedule(absl::Now() + absl::Milliseconds(20), [] {});
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(timers.cancel(near));
  Promise<int> later;
  timers.schedule(absl::Now() + absl::Milliseconds(50), [&] { later.set(1); });
  ASSERT_TRUE(later.future().get(absl::Now() + absl::Seconds(10)).ok());
}

TEST(TimerQueue, InfiniteDeadlineSchedulesNothing) {
  TimerQueue timers;
  EXPECT_EQ(timers.schedule(absl::InfiniteFuture(), [] {}), 0u);
}

TEST(TimerQueue, RunningOwnerIsTheOwnerOnTheTimerThreadOnly) {
  int owner = 0;
  TimerQueue timers(&owner);
  Promise<const void*> seen;
  timers.schedule(absl::Now(),
                  [seen] { seen.set(TimerQueue::running_owner()); });
  absl::StatusOr<const void*> on_timer_thread =
      seen.future().get(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(on_timer_thread.ok());
  EXPECT_EQ(*on_timer_thread, &owner);
  EXPECT_EQ(TimerQueue::running_owner(), nullptr);
}

// The owner of a queue may go in one of the queue's callbacks (the last
// reference to it dropped there, as an RRef context's timeout can while its
// worker shuts down): the queue is then destroyed on its own thread, which
// must not join itself (std::system_error, EDEADLK, ended the process).
TEST(TimerQueue, MayBeDestroyedByItsOwnCallback) {
  auto timers = std::make_shared<std::unique_ptr<TimerQueue>>(
      std::make_unique<TimerQueue>());
  Promise<bool> destroyed;
  bool ran_later = false;
  // Dropped with the queue, never run. (Scheduled first: the queue may be
  // gone as soon as the other one is.)
  (*timers)->schedule(absl::Now() + absl::Hours(1),
                      [&ran_later] { ran_later = true; });
  (*timers)->schedule(absl::Now(), [timers, destroyed] {
    timers->reset();
    destroyed.set(true);
  });
  EXPECT_TRUE(destroyed.future().get(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_FALSE(ran_later);
}

}  // namespace
}  // namespace tether::internal
