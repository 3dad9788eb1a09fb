#include "testing/agent_conformance.h"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::HasSubstr;

TEST_P(AgentConformance, RequestAndResponseCarryPayloadAndStorages) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  Message request = ping("hello");
  request.storages.push_back(make_storage(100, 1));
  request.storages.push_back(make_storage(0, 2));
  request.storages.push_back(make_storage(4096, 3));
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), std::move(request), kBound).get();
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->type, MessageType::kPong);
  EXPECT_EQ(response->payload, "hello/pong");
  ASSERT_EQ(response->storages.size(), 3u);
  EXPECT_TRUE(storage_matches(response->storages[0], 100, 1));
  EXPECT_TRUE(storage_matches(response->storages[1], 0, 2));
  EXPECT_TRUE(storage_matches(response->storages[2], 4096, 3));
}

TEST_P(AgentConformance, SendToSelf) {
  AgentGroup group(GetParam().backend(), 1);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  absl::StatusOr<Message> response =
      group[0].send(group[0].self(), ping("me"), kBound).get();
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload, "me/pong");
}

TEST_P(AgentConformance, WorkerInfosInRankOrder) {
  AgentGroup group(GetParam().backend(), 3);
  ASSERT_TRUE(group.ok());
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(group[rank].self().id, rank);
    ASSERT_EQ(group[rank].worker_infos().size(), 3u);
    EXPECT_EQ(group[rank].worker_infos()[2].name, "agent2");
  }
}

TEST_P(AgentConformance, ManyRequestsInFlightBothWays) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  constexpr int kCalls = 1000;
  std::vector<Future<Message>> futures;
  for (int i = 0; i < kCalls; ++i) {
    int from = i % 2;
    Message request = ping(absl::StrCat("call", i));
    request.storages.push_back(make_storage(64, static_cast<uint8_t>(i)));
    futures.push_back(
        group[from].send(group[1 - from].self(), std::move(request), kBound));
  }
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<Message> response = futures[i].get();
    ASSERT_THAT(response, IsOk()) << "call " << i;
    EXPECT_EQ(response->payload, absl::StrCat("call", i, "/pong"));
    ASSERT_EQ(response->storages.size(), 1u);
    EXPECT_TRUE(
        storage_matches(response->storages[0], 64, static_cast<uint8_t>(i)));
  }
}

TEST_P(AgentConformance, LargeStorageRoundTrip) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  constexpr size_t kBytes = 64 << 20;
  Message request = ping("big");
  request.storages.push_back(make_storage(kBytes, 7));
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), std::move(request), kBound).get();
  ASSERT_THAT(response, IsOk());
  ASSERT_EQ(response->storages.size(), 1u);
  EXPECT_TRUE(storage_matches(response->storages[0], kBytes, 7));
}

TEST_P(AgentConformance, HandlerErrorReachesSenderWithCodeAndText) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all([](Message) {
    return Future<Message>::ready(
        absl::InvalidArgumentError("the handler says no"));
  });
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), ping("x"), kBound).get();
  EXPECT_THAT(response, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("the handler says no")));
}

TEST_P(AgentConformance, UnknownPeerIsUnavailable) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  absl::StatusOr<Message> response =
      group[0].send(WorkerInfo{"nobody", 9}, ping("x"), kBound).get();
  EXPECT_THAT(response, StatusIs(absl::StatusCode::kUnavailable));
}

TEST_P(AgentConformance, TimeoutFailsWithDeadlineExceeded) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  absl::Time start = absl::Now();
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), ping("slow"), absl::Milliseconds(200))
          .get(absl::Now() + kBound);
  EXPECT_THAT(response, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  // The late response is dropped harmlessly; the agent keeps working. (The
  // request may reach the handler after the timeout: wait for it first.)
  held->wait_for(1);
  held->release_all();
  Future<Message> next =
      group[0].send(group[1].self(), ping("next"), kBound);
  held->wait_for(1);
  held->release_all();
  absl::StatusOr<Message> second = next.get(absl::Now() + kBound);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->payload, "next/late");
}

TEST_P(AgentConformance, ShutdownCancelsPendingAndLaterSends) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  std::vector<Future<Message>> pending;
  for (int i = 0; i < 10; ++i) {
    pending.push_back(group[0].send(group[1].self(), ping("p"), kBound));
  }
  held->wait_for(10);
  group[0].shutdown();
  for (Future<Message>& future : pending) {
    EXPECT_THAT(future.get(absl::Now() + kBound),
                StatusIs(absl::StatusCode::kCancelled));
  }
  EXPECT_THAT(group[0].send(group[1].self(), ping("after"), kBound)
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled));
  // Responses to a shut-down sender are dropped without harm.
  held->release_all();
  group[0].shutdown();  // idempotent
}

TEST_P(AgentConformance, JoinWaitsForRequestsInFlight) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  Future<Message> call = group[0].send(group[1].self(), ping("j"), kBound);
  held->wait_for(1);
  std::atomic<int> joined{0};
  std::vector<std::thread> joiners;
  std::vector<absl::Status> results(2);
  for (int rank = 0; rank < 2; ++rank) {
    joiners.emplace_back([&, rank] {
      results[rank] = group[rank].join(kBound);
      ++joined;
    });
  }
  // Both joiners are blocked by the held request; releasing it lets them go.
  EXPECT_FALSE(call.is_ready());
  EXPECT_EQ(joined.load(), 0);
  held->release_all();
  for (std::thread& joiner : joiners) joiner.join();
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], IsOk());
  ASSERT_THAT(call.get(absl::Now() + kBound), IsOk());
}

TEST_P(AgentConformance, JoinTimesOutWhenAPeerNeverJoins) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  EXPECT_THAT(group[0].join(absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

}  // namespace
}  // namespace tether::testing
