#include "core/toolkit/pending_requests.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::internal {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

Message response(std::string payload) {
  Message message;
  message.type = MessageType::kPong;
  message.payload = std::move(payload);
  return message;
}

PendingRequests::Request add(
    PendingRequests& pending,
    absl::Duration timeout = absl::InfiniteDuration()) {
  absl::StatusOr<PendingRequests::Request> request =
      pending.add(timeout, MessageType::kPing, "b");
  EXPECT_THAT(request, IsOk());
  return *std::move(request);
}

// Returns once every timer due by `deadline` has run (the queue runs them
// in deadline order).
void wait_for_timers_due_by(TimerQueue& timers, absl::Time deadline) {
  Promise<int> passed;
  timers.schedule(deadline, [passed] { passed.set(0); });
  ASSERT_THAT(passed.future().get(absl::Now() + kBound), IsOk());
}

// What the watch of silent peers reads and does (backends/common's
// skeleton): calls other than PINGs by peer, the oldest first; a peer's
// requests failed together; a drain that leaves PINGs out.
TEST(PendingRequests, PeersThatCallsWaitOnAndTheirFailure) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  const absl::Time before = absl::Now();
  absl::StatusOr<PendingRequests::Request> to_a =
      pending.add(absl::InfiniteDuration(), MessageType::kCall, "a");
  absl::StatusOr<PendingRequests::Request> to_c =
      pending.add(absl::InfiniteDuration(), MessageType::kCall, "c");
  PendingRequests::Request ping = add(pending);  // a PING to "b"
  ASSERT_THAT(to_a, IsOk());
  ASSERT_THAT(to_c, IsOk());
  std::vector<std::pair<std::string, absl::Time>> waiting =
      pending.waiting_since();
  std::sort(waiting.begin(), waiting.end());
  ASSERT_EQ(waiting.size(), 2u);  // not "b": only a PING waits on it
  EXPECT_EQ(waiting[0].first, "a");
  EXPECT_EQ(waiting[1].first, "c");
  EXPECT_GE(waiting[0].second, before);
  EXPECT_EQ(pending.calls(), 2u);

  pending.fail_peer("a", absl::UnavailableError("a is lost"));
  EXPECT_THAT(to_a->response.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("a is lost")));
  EXPECT_FALSE(to_c->response.is_ready());
  EXPECT_FALSE(pending.wait_until_no_calls(absl::Now()));
  EXPECT_TRUE(pending.complete(to_c->id, response("c")));
  EXPECT_TRUE(pending.wait_until_no_calls(absl::Now()));
  EXPECT_EQ(pending.calls(), 0u);
  EXPECT_EQ(pending.size(), 1u);  // the PING
  EXPECT_TRUE(pending.complete(ping.id, response("pong")));
}

TEST(PendingRequests, CompleteDeliversTheResponseOnce) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  PendingRequests::Request first = add(pending, kBound);
  PendingRequests::Request second = add(pending);
  EXPECT_GE(first.id, 1);
  EXPECT_NE(first.id, second.id);
  EXPECT_EQ(pending.size(), 2u);
  EXPECT_FALSE(first.response.is_ready());

  EXPECT_TRUE(pending.complete(first.id, response("one")));
  EXPECT_FALSE(pending.complete(first.id, response("again")));
  absl::StatusOr<Message> result = first.response.get(absl::Now() + kBound);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->payload, "one");
  EXPECT_FALSE(pending.contains(first.id));
  EXPECT_TRUE(pending.contains(second.id));

  EXPECT_TRUE(pending.complete(
      second.id, absl::InvalidArgumentError("the handler says no")));
  EXPECT_THAT(second.response.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(pending.size(), 0u);
}

TEST(PendingRequests,
     TimeoutFailsWithDeadlineExceededAndLateResponseIsDropped) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  const absl::Time start = absl::Now();
  PendingRequests::Request request = add(pending, absl::Milliseconds(50));
  EXPECT_THAT(request.response.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("PING request to worker 'b' timed out after "
                                 "50ms")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_FALSE(pending.complete(request.id, response("late")));
  EXPECT_EQ(pending.size(), 0u);
}

TEST(PendingRequests, ResponseBeforeTheTimeoutWins) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(50);
  PendingRequests::Request request = add(pending, absl::Milliseconds(50));
  ASSERT_TRUE(pending.complete(request.id, response("in time")));
  wait_for_timers_due_by(timers, deadline + absl::Milliseconds(10));
  absl::StatusOr<Message> result = request.response.get(absl::Now() + kBound);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->payload, "in time");
}

TEST(PendingRequests, WithoutTimeoutStaysPending) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  PendingRequests::Request request = add(pending);
  EXPECT_THAT(request.response.wait(absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(pending.contains(request.id));
  EXPECT_TRUE(pending.complete(request.id, response("eventually")));
}

TEST(PendingRequests, FailConnectionFailsOnlyTheRequestsThatLeftOnIt) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  PendingRequests::Request on_one = add(pending, kBound);
  PendingRequests::Request on_two = add(pending, kBound);
  PendingRequests::Request not_left = add(pending, kBound);
  ASSERT_TRUE(pending.set_connection(on_one.id, 1));
  ASSERT_TRUE(pending.set_connection(on_two.id, 2));

  pending.fail_connection(1, absl::UnavailableError("lost worker 'b'"));
  EXPECT_THAT(
      on_one.response.get(absl::Now() + kBound),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("lost worker 'b'")));
  EXPECT_FALSE(on_two.response.is_ready());
  EXPECT_FALSE(not_left.response.is_ready());
  EXPECT_EQ(pending.size(), 2u);
  EXPECT_TRUE(pending.complete(on_two.id, response("two")));
  EXPECT_TRUE(pending.complete(not_left.id, response("three")));
}

TEST(PendingRequests, SetConnectionRefusesARequestNoLongerPending) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  PendingRequests::Request request = add(pending);
  ASSERT_TRUE(pending.complete(request.id, response("done")));
  EXPECT_FALSE(pending.set_connection(request.id, 1));
  EXPECT_FALSE(pending.contains(request.id));
}

TEST(PendingRequests, CancelAllFailsEverythingAndLaterAdds) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  std::vector<PendingRequests::Request> requests;
  requests.push_back(add(pending));
  requests.push_back(add(pending, absl::Milliseconds(20)));
  requests.push_back(add(pending, kBound));
  ASSERT_TRUE(pending.set_connection(requests[2].id, 7));

  pending.cancel_all(absl::CancelledError("worker 'a' shut down"));
  for (const PendingRequests::Request& request : requests) {
    EXPECT_THAT(request.response.get(absl::Now() + kBound),
                StatusIs(absl::StatusCode::kCancelled,
                         HasSubstr("worker 'a' shut down")));
    EXPECT_FALSE(pending.complete(request.id, response("late")));
  }
  EXPECT_EQ(pending.size(), 0u);
  EXPECT_TRUE(pending.wait_until_empty(absl::Now()));
  EXPECT_THAT(pending.add(kBound, MessageType::kPing, "b"),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("worker 'a' shut down")));
  // Only the first call counts.
  pending.cancel_all(absl::InternalError("second"));
  EXPECT_THAT(pending.add(kBound, MessageType::kPing, "b"),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST(PendingRequests, WaitUntilEmptyReturnsOnceTheLastCompletes) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  EXPECT_TRUE(pending.wait_until_empty(absl::Now()));
  PendingRequests::Request request = add(pending);
  EXPECT_FALSE(pending.wait_until_empty(absl::Now() + absl::Milliseconds(20)));
  std::thread responder(
      [&] { EXPECT_TRUE(pending.complete(request.id, response("r"))); });
  EXPECT_TRUE(pending.wait_until_empty(absl::Now() + kBound));
  responder.join();
}

// Callbacks run outside the lock: one may call back in, as an agent does
// when a caller sends again from the callback of a failed send.
TEST(PendingRequests, CallbacksMayCallBackIn) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  std::vector<PendingRequests::Request> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(add(pending, kBound));
  requests.push_back(add(pending, absl::Milliseconds(10)));
  std::atomic<int> called{0};
  for (PendingRequests::Request& request : requests) {
    request.response.on_complete(
        [&pending, &called](const absl::StatusOr<Message>&) {
          (void)pending.size();
          (void)pending.add(kBound, MessageType::kPing, "b");
          ++called;
        });
  }
  ASSERT_TRUE(pending.set_connection(requests[1].id, 1));
  EXPECT_TRUE(pending.complete(requests[0].id, response("r")));
  pending.fail_connection(1, absl::UnavailableError("lost"));
  EXPECT_THAT(requests[4].response.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  pending.cancel_all(absl::CancelledError("shut down"));
  for (const PendingRequests::Request& request : requests) {
    ASSERT_THAT(request.response.wait(absl::Now() + kBound), IsOk());
  }
  EXPECT_EQ(called.load(), 5);
}

TEST(PendingRequests, DestructionFailsWhatIsPendingAndDisarmsTimers) {
  TimerQueue timers;
  PendingRequests::Request request;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(20);
  {
    PendingRequests pending(&timers);
    request = add(pending, absl::Milliseconds(20));
  }
  EXPECT_THAT(request.response.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled));
  // Its timer fires into nothing.
  wait_for_timers_due_by(timers, deadline + absl::Milliseconds(10));
}

TEST(PendingRequests, EveryRequestCompletesOnceUnderRaces) {
  TimerQueue timers;
  PendingRequests pending(&timers);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  std::vector<std::vector<PendingRequests::Request>> requests(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pending, &requests, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Timeouts of 0 to 2 ms race the responses below.
        absl::StatusOr<PendingRequests::Request> request =
            pending.add(absl::Microseconds(i % 3 * 1000), MessageType::kPing,
                        "b");
        ASSERT_THAT(request, IsOk());
        requests[t].push_back(*request);
        if (i % 2 == 0) (void)pending.set_connection(request->id, t + 1);
        if (i % 4 != 0) (void)pending.complete(request->id, response("r"));
      }
      pending.fail_connection(t + 1, absl::UnavailableError("lost"));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& of_thread : requests) {
    for (const PendingRequests::Request& request : of_thread) {
      absl::StatusOr<Message> result =
          request.response.get(absl::Now() + kBound);
      if (!result.ok()) {
        EXPECT_THAT(result.status().code(),
                    ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded,
                                     absl::StatusCode::kUnavailable));
      }
    }
  }
  EXPECT_EQ(pending.size(), 0u);
}

}  // namespace
}  // namespace tether::internal
