#include "core/toolkit/poll_policy.h"

#include <gtest/gtest.h>
#include <sys/sysinfo.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace tether {
namespace {

TEST(RunnableThreadsTest, ReadsTheKernelsCount) {
  EXPECT_EQ(internal::runnable_threads("0.52 0.58 0.59 3/457 12345\n"), 3);
  EXPECT_EQ(internal::runnable_threads("12.00 9.10 4.00 17/1024 99"), 17);
}

TEST(RunnableThreadsTest, RefusesOtherText) {
  EXPECT_EQ(internal::runnable_threads(""), std::nullopt);
  EXPECT_EQ(internal::runnable_threads("0.52 0.58 0.59"), std::nullopt);
  EXPECT_EQ(internal::runnable_threads("0.52 0.58 0.59 x/457 1"),
            std::nullopt);
  EXPECT_EQ(internal::runnable_threads("0.52 0.58 0.59 -1/457 1"),
            std::nullopt);
}

TEST(PollWindowTest, PollsForItsWindowAfterWork) {
  PollWindow window(PollPolicy{absl::Milliseconds(20), false});
  EXPECT_TRUE(window.enabled());
  EXPECT_FALSE(window.keep_polling());  // no work yet
  window.worked();
  EXPECT_TRUE(window.keep_polling());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(window.keep_polling());
  window.worked();
  EXPECT_TRUE(window.keep_polling());
}

TEST(PollWindowTest, AZeroWindowNeverPolls) {
  PollWindow window(PollPolicy{absl::ZeroDuration(), false});
  EXPECT_FALSE(window.enabled());
  window.worked();
  EXPECT_FALSE(window.keep_polling());
}

// With more threads ready to run than cores, none is spare, and a window
// that polls only on spare cores stops at once. (That cores are spare on an
// idle machine is not asserted: the machine running the test is shared.)
TEST(PollWindowTest, StopsWhenThreadsWaitForACore) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < ::get_nprocs() + 3; ++i) {
    busy.emplace_back([&stop] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  bool spare = true;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (spare && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    spare = cores_are_spare();
  }
  EXPECT_FALSE(spare);
  PollWindow window(PollPolicy{absl::Seconds(10), true});
  window.worked();
  EXPECT_FALSE(window.keep_polling());
  PollWindow regardless(PollPolicy{absl::Seconds(10), false});
  regardless.worked();
  EXPECT_TRUE(regardless.keep_polling());
  stop = true;
  for (std::thread& thread : busy) thread.join();
}

}  // namespace
}  // namespace tether
