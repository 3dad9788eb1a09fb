#include "core/toolkit/lifeline.h"

#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace tether::internal {
namespace {

TEST(LifelineTest, UseRunsWithTheObjectUntilClosed) {
  int object = 7;
  Lifeline<int> lifeline(object);
  int seen = 0;
  EXPECT_TRUE(lifeline.use([&](int& o) { seen = o; }));
  EXPECT_EQ(seen, 7);

  lifeline.close();
  bool ran = false;
  EXPECT_FALSE(lifeline.use([&](int&) { ran = true; }));
  EXPECT_FALSE(ran);
}

TEST(LifelineTest, CloseWaitsForTheUseRunning) {
  int object = 0;
  Lifeline<int> lifeline(object);
  absl::Notification entered;
  absl::Notification release;
  std::atomic<bool> use_finished{false};
  std::thread user([&] {
    lifeline.use([&](int&) {
      entered.Notify();
      release.WaitForNotification();
      use_finished = true;
    });
  });
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));

  std::atomic<bool> closed{false};
  std::atomic<bool> use_finished_before_close{false};
  std::thread closer([&] {
    lifeline.close();
    use_finished_before_close = use_finished.load();
    closed = true;
  });
  // Once close has begun, new uses are refused; it still waits for the one
  // running.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (lifeline.use([](int&) {}) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_FALSE(lifeline.use([](int&) {}));
  EXPECT_FALSE(closed);

  release.Notify();
  user.join();
  closer.join();
  EXPECT_TRUE(closed);
  EXPECT_TRUE(use_finished_before_close);
}

TEST(LifelineTest, UsesRunConcurrently) {
  int object = 0;
  Lifeline<int> lifeline(object);
  absl::Notification first_in;
  absl::Notification second_in;
  bool first_saw_second = false;
  std::thread first([&] {
    lifeline.use([&](int&) {
      first_in.Notify();
      first_saw_second =
          second_in.WaitForNotificationWithTimeout(absl::Seconds(10));
    });
  });
  ASSERT_TRUE(first_in.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(lifeline.use([&](int&) { second_in.Notify(); }));
  first.join();
  EXPECT_TRUE(first_saw_second);
  lifeline.close();
}

TEST(LifelineTest, AThrowingUseEndsItsUse) {
  int object = 0;
  Lifeline<int> lifeline(object);
  EXPECT_THROW(
      lifeline.use([](int&) { throw std::runtime_error("the use failed"); }),
      std::runtime_error);
  // close returns: the use that threw holds the object no more.
  lifeline.close();
  EXPECT_FALSE(lifeline.use([](int&) {}));
}

}  // namespace
}  // namespace tether::internal
