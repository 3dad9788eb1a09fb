#include "testing/agent_conformance.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <gmock/gmock.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "core/toolkit/receive_buffers.h"
#include "testing/agent_checks.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

TEST_P(AgentConformance, RequestAndResponseCarryPayloadAndStorages) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  expect_round_trip_with_storages(group[0], group[1].self());
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
    expect_worker_infos(group[rank], rank, 3);
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
    futures.push_back(send_call(group[from], group[1 - from].self(), i));
  }
  for (int i = 0; i < kCalls; ++i) expect_call_echoed(futures[i], i);
}

TEST_P(AgentConformance, LargeStorageRoundTrip) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  expect_large_storage_round_trip(group[0], group[1].self());
}

// Storages either side of every size where a backend changes how it moves
// them (inline in the message, on the connection, through a channel; gRPC's
// chunks), several to a message, all in flight at once, arrive whole.
TEST_P(AgentConformance, StoragesAcrossEverySizeClassRoundTrip) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  const std::vector<std::vector<size_t>> messages = {
      {1, (32 << 10) - 1},
      {32 << 10},
      {(32 << 10) + 1},
      {(48 << 10) - 1, 1},
      {(48 << 10) + 1},
      {(64 << 10) - 1},
      {64 << 10},
      {(64 << 10) + 1},
      {100 << 10, 0, 100 << 10, 50 << 10},
      {256 << 10},
      {(256 << 10) + 1, 7},
      {(1 << 20) + 3, 64 << 10},
  };
  std::vector<Future<Message>> calls;
  for (size_t i = 0; i < messages.size(); ++i) {
    Message request = ping(absl::StrCat("sizes:", i));
    for (size_t j = 0; j < messages[i].size(); ++j) {
      request.storages.push_back(
          make_storage(messages[i][j], static_cast<uint8_t>(10 * i + j)));
    }
    calls.push_back(group[0].send(group[1].self(), std::move(request), kBound));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    absl::StatusOr<Message> response = calls[i].get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk()) << "message " << i;
    EXPECT_EQ(response->payload, absl::StrCat("sizes:", i, "/pong"));
    ASSERT_EQ(response->storages.size(), messages[i].size());
    for (size_t j = 0; j < messages[i].size(); ++j) {
      EXPECT_TRUE(storage_matches(response->storages[j], messages[i][j],
                                  static_cast<uint8_t>(10 * i + j)))
          << "message " << i << ", storage " << j;
    }
  }
}

// Small requests whose answers are of every size class, all in flight at
// once, with small and large requests between them: each answer arrives
// whole, whatever way its request went (a backend may send small messages
// by a shorter way than large ones, and answer a small request's large
// answer by the long one).
TEST_P(AgentConformance, SmallRequestsGetAnswersOfEverySize) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  constexpr absl::string_view kGrow = "grow:";
  group.start_all([kGrow](Message request) {
    if (!absl::StartsWith(request.payload, kGrow)) return echo(request);
    size_t nbytes = 0;
    if (!absl::SimpleAtoi(request.payload.substr(kGrow.size()), &nbytes)) {
      return Future<Message>::ready(
          absl::InvalidArgumentError(request.payload));
    }
    Message response;
    response.type = MessageType::kPong;
    response.payload = request.payload;
    response.storages.push_back(
        make_storage(nbytes, static_cast<uint8_t>(nbytes % 251)));
    return Future<Message>::ready(std::move(response));
  });
  const std::vector<size_t> answers = {
      0, 8, (48 << 10) - 64, (48 << 10) + 1, 100 << 10, (256 << 10) + 1,
      (2 << 20) + 5, 16};
  std::vector<Future<Message>> calls;
  std::vector<Future<Message>> echoes;
  for (int round = 0; round < 3; ++round) {
    for (size_t nbytes : answers) {
      calls.push_back(group[0].send(group[1].self(),
                                    ping(absl::StrCat(kGrow, nbytes)), kBound));
      // Between them, an echo of a large request and of a small one.
      Message large = ping("large");
      large.storages.push_back(make_storage(300 << 10, 3));
      echoes.push_back(group[0].send(group[1].self(), std::move(large), kBound));
      echoes.push_back(group[0].send(group[1].self(), ping("small"), kBound));
    }
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const size_t nbytes = answers[i % answers.size()];
    absl::StatusOr<Message> response = calls[i].get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk()) << "answer of " << nbytes << " bytes";
    EXPECT_EQ(response->payload, absl::StrCat(kGrow, nbytes));
    ASSERT_EQ(response->storages.size(), 1u);
    EXPECT_TRUE(storage_matches(response->storages[0], nbytes,
                                static_cast<uint8_t>(nbytes % 251)))
        << "answer of " << nbytes << " bytes";
  }
  for (size_t i = 0; i < echoes.size(); ++i) {
    absl::StatusOr<Message> response = echoes[i].get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk()) << "echo " << i;
    if (i % 2 == 0) {
      ASSERT_EQ(response->storages.size(), 1u);
      EXPECT_TRUE(storage_matches(response->storages[0], 300 << 10, 3));
    } else {
      EXPECT_EQ(response->payload, "small/pong");
    }
  }
}

// Every backend whose peers live apart receives large storages into the
// shared cache of receive buffers (core/toolkit/receive_buffers.h), so
// that a stream of large tensors does not fault in fresh pages for each
// one: of 16 large receives (8 requests, 8 responses, one process), every
// one comes from the cache, which allocates only the few buffers in use at
// once.
TEST_P(RemotePeerConformance, LargeStoragesArriveInReusedReceiveBuffers) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  constexpr size_t kBytes = ::tether::internal::kReusedBufferBytes * 2;
  constexpr int kCalls = 8;
  ::tether::internal::drop_idle_receive_buffers();
  const ::tether::internal::ReceiveBufferStats before = ::tether::internal::receive_buffer_stats();
  for (int i = 0; i < kCalls; ++i) {
    Message request = ping("big");
    request.storages.push_back(make_storage(kBytes, static_cast<uint8_t>(i)));
    absl::StatusOr<Message> response =
        group[0].send(group[1].self(), std::move(request), kBound)
            .get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk()) << "call " << i;
    ASSERT_EQ(response->storages.size(), 1u);
    EXPECT_TRUE(storage_matches(response->storages[0], kBytes,
                                static_cast<uint8_t>(i)))
        << "call " << i;
  }
  const ::tether::internal::ReceiveBufferStats after = ::tether::internal::receive_buffer_stats();
  const int64_t allocated = after.allocated - before.allocated;
  const int64_t reused = after.reused - before.reused;
  EXPECT_EQ(allocated + reused, 2 * kCalls);
  EXPECT_LE(allocated, 4);
}

TEST_P(AgentConformance, HandlerErrorReachesSenderWithCodeAndText) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(refuse);
  expect_handler_error(group[0], group[1].self());
}

TEST_P(AgentConformance, UnknownPeerIsUnavailable) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  expect_unknown_peer_unavailable(group[0]);
}

TEST_P(AgentConformance, TimeoutFailsWithDeadlineExceeded) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  expect_timeout_then_working(group[0], group[1].self(), *held);
}

TEST_P(AgentConformance, RequestThatTimesOutBeforeItLeavesIsStillDelivered) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  expect_timed_out_before_leaving_still_delivered(group[0], group[1].self(),
                                                  *held);
}

TEST_P(AgentConformance, RequestOverTheCalleesLimitsIsRefusedNotTheConnection) {
  AgentGroup group(GetParam().backend(), 2, {}, {},
                   {MessageLimits(), small_limits()});
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all(
      [held](Message request) { return held->hold(std::move(request)); });
  expect_over_limits_refused(group[0], group[1].self(), *held);
}

TEST_P(AgentConformance, ShutdownCancelsPendingAndLaterSends) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  expect_shutdown_cancels(group[0], group[1].self(), *held);
  // Responses to a shut-down sender are dropped without harm.
  held->release_all();
}

TEST_P(AgentConformance, HandlerMaySendNestedRequests) {
  AgentGroup group(GetParam().backend(), 3);
  ASSERT_TRUE(group.ok());
  AgentGroup* g = &group;
  group.start_all([g](Message request) -> Future<Message> {
    if (request.payload.rfind("fwd:", 0) != 0) return echo(std::move(request));
    // On agent1's own thread: forward to agent2, answer with its reply.
    Message onward = ping(request.payload.substr(4));
    onward.storages = std::move(request.storages);
    return (*g)[1]
        .send((*g)[2].self(), std::move(onward), kBound)
        .then([](const absl::StatusOr<Message>& reply)
                  -> absl::StatusOr<Message> {
          if (!reply.ok()) return reply.status();
          Message response = *reply;
          response.payload += "/via1";
          return response;
        });
  });
  constexpr int kCalls = 20;
  // Small storages and large ones (which some backends move differently).
  auto size_of = [](int i) -> size_t { return i % 2 == 0 ? 100 : 200 << 10; };
  std::vector<Future<Message>> calls;
  for (int i = 0; i < kCalls; ++i) {
    Message request = ping(absl::StrCat("fwd:", i));
    request.storages.push_back(
        make_storage(size_of(i), static_cast<uint8_t>(i)));
    calls.push_back(group[0].send(group[1].self(), std::move(request), kBound));
  }
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<Message> response = calls[i].get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->payload, absl::StrCat(i, "/pong/via1"));
    ASSERT_EQ(response->storages.size(), 1u);
    EXPECT_TRUE(storage_matches(response->storages[0], size_of(i),
                                static_cast<uint8_t>(i)));
  }
}

TEST_P(AgentConformance, ShutdownFromInsideTheHandlerDoesNotDeadlock) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  expect_shutdown_inside_handler_is_safe(group[0], group[1]);
  // The group's destructor shuts agent1 down again: it waits for the first
  // shutdown's joins.
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

// Backends whose peers live apart (AgentTraits::remote_peers).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RemotePeerConformance);

TEST_P(RemotePeerConformance, RequestsArrivingBeforeStartAreServedAfterIt) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  expect_served_after_start(group[0], group[1]);
}

TEST_P(RemotePeerConformance, PeerShutdownFailsPendingRequestsWithUnavailable) {
  AgentGroup group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all(
      [held](Message request) { return held->hold(std::move(request)); });
  expect_peer_shutdown_fails_pending(group[0], group[1], *held);
}

}  // namespace
}  // namespace tether::testing
