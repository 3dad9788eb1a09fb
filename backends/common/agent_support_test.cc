#include "backends/common/agent_support.h"

#include <absl/synchronization/notification.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::backends::common {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

TEST(ShutdownOnce, OnlyTheFirstCallDoesTheWorkAndOthersWaitForIt) {
  ShutdownOnce once;
  ASSERT_TRUE(once.begin(/*on_own_thread=*/false));
  std::atomic<bool> joined{false};
  absl::Notification later_returned;
  std::thread later([&] {
    EXPECT_FALSE(once.begin(/*on_own_thread=*/false));
    // Returns only after the first call's joins.
    EXPECT_TRUE(joined.load());
    later_returned.Notify();
  });
  EXPECT_FALSE(
      later_returned.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  once.finish(/*on_own_thread=*/false, [&] { joined = true; });
  later.join();
}

TEST(ShutdownOnce, FromAnOwnThreadTheJoinsRunElsewhere) {
  ShutdownOnce once;
  ASSERT_TRUE(once.begin(/*on_own_thread=*/true));
  // A later call on an own thread returns at once, before the work is done.
  EXPECT_FALSE(once.begin(/*on_own_thread=*/true));
  const std::thread::id here = std::this_thread::get_id();
  std::thread::id ran_on;
  once.finish(/*on_own_thread=*/true,
              [&ran_on] { ran_on = std::this_thread::get_id(); });
  // A later call elsewhere waits for the detached joins.
  EXPECT_FALSE(once.begin(/*on_own_thread=*/false));
  EXPECT_NE(ran_on, std::thread::id());
  EXPECT_NE(ran_on, here);
}

std::shared_ptr<c10d::Store> make_store() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  return std::shared_ptr<c10d::Store>(store.get(), [store](c10d::Store*) {});
}

TEST(ExchangeThroughStore, EveryRankGetsWhatEachPublished) {
  std::shared_ptr<c10d::Store> store = make_store();
  std::vector<absl::StatusOr<std::vector<std::string>>> results(3);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.emplace_back([&, rank] {
      results[rank] = exchange_through_store(
          *store, "test/", rank, 3, std::string(1, 'a' + rank),
          absl::Seconds(30), "agent");
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (const auto& result : results) {
    ASSERT_THAT(result, IsOk());
    EXPECT_THAT(*result, ElementsAre("a", "b", "c"));
  }
}

TEST(ExchangeThroughStore, TimesOutNamingTheRanksThatDidNotPublish) {
  std::shared_ptr<c10d::Store> store = make_store();
  EXPECT_THAT(exchange_through_store(*store, "test/", 1, 4, "x",
                                     absl::Milliseconds(100),
                                     "the agent of w1"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("the agent of w1"),
                             HasSubstr("rank(s) 0, 2, 3"))));
}

TEST(CallHandler, ExceptionsAndInvalidFuturesBecomeInternalErrors) {
  RequestHandler throws = [](Message) -> Future<Message> {
    throw std::runtime_error("boom");
  };
  EXPECT_THAT(call_handler(throws, Message(), "w0").result(),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("w0"), HasSubstr("boom"))));
  RequestHandler invalid = [](Message) { return Future<Message>(); };
  EXPECT_THAT(call_handler(invalid, Message(), "w0").result(),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("invalid future")));
}

}  // namespace
}  // namespace tether::backends::common
