#include "core/toolkit/serial_executor.h"

#include <absl/synchronization/notification.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace tether::internal {
namespace {

TEST(SerialExecutor, RunsTasksInOrderOnItsOwnThread) {
  SerialExecutor executor;
  EXPECT_FALSE(executor.in_thread());
  std::vector<int> order;  // only touched by the executor's thread
  std::thread::id seen;
  absl::Notification done;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(executor.post([&, i] {
      order.push_back(i);
      if (i == 99) {
        seen = std::this_thread::get_id();
        EXPECT_TRUE(executor.in_thread());
        done.Notify();
      }
    }));
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_NE(seen, std::this_thread::get_id());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(SerialExecutor, StopRunsQueuedTasksThenRefusesNewOnes) {
  SerialExecutor executor;
  absl::Notification release;
  int ran = 0;
  ASSERT_TRUE(executor.post([&] { release.WaitForNotification(); }));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(executor.post([&] { ++ran; }));
  std::thread stopper([&] { executor.stop(); });
  release.Notify();
  stopper.join();
  EXPECT_EQ(ran, 5);
  EXPECT_FALSE(executor.post([&] { ++ran; }));
  executor.stop();  // idempotent
  EXPECT_EQ(ran, 5);
}

}  // namespace
}  // namespace tether::internal
