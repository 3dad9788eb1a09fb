#include "testing/agent_checks.h"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::testing {

using ::testing::HasSubstr;

void expect_round_trip_with_storages(Agent& from, const WorkerInfo& to) {
  Message request = ping("hello");
  request.storages.push_back(make_storage(100, 1));
  request.storages.push_back(make_storage(0, 2));
  request.storages.push_back(make_storage(4096, 3));
  absl::StatusOr<Message> response =
      from.send(to, std::move(request), kBound).get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->type, MessageType::kPong);
  EXPECT_EQ(response->payload, "hello/pong");
  ASSERT_EQ(response->storages.size(), 3u);
  EXPECT_TRUE(storage_matches(response->storages[0], 100, 1));
  EXPECT_TRUE(storage_matches(response->storages[1], 0, 2));
  EXPECT_TRUE(storage_matches(response->storages[2], 4096, 3));
}

void expect_large_storage_round_trip(Agent& from, const WorkerInfo& to) {
  constexpr size_t kBytes = 64 << 20;
  Message request = ping("big");
  request.storages.push_back(make_storage(kBytes, 7));
  absl::StatusOr<Message> response =
      from.send(to, std::move(request), kBound).get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk());
  ASSERT_EQ(response->storages.size(), 1u);
  EXPECT_TRUE(storage_matches(response->storages[0], kBytes, 7));
}

Future<Message> send_call(Agent& from, const WorkerInfo& to, int i) {
  Message request = ping(absl::StrCat("call", i));
  request.storages.push_back(make_storage(64, static_cast<uint8_t>(i)));
  return from.send(to, std::move(request), kBound);
}

void expect_call_echoed(const Future<Message>& call, int i) {
  absl::StatusOr<Message> response = call.get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk()) << "call " << i;
  EXPECT_EQ(response->payload, absl::StrCat("call", i, "/pong"));
  ASSERT_EQ(response->storages.size(), 1u);
  EXPECT_TRUE(
      storage_matches(response->storages[0], 64, static_cast<uint8_t>(i)));
}

void expect_handler_error(Agent& from, const WorkerInfo& to) {
  EXPECT_THAT(from.send(to, ping("x"), kBound).get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the handler says no")));
}

void expect_unknown_peer_unavailable(Agent& from) {
  EXPECT_THAT(from.send(WorkerInfo{"nobody", 9}, ping("x"), kBound)
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable));
}

void expect_worker_infos(const Agent& agent, int rank, int size) {
  EXPECT_EQ(agent.self().id, rank);
  EXPECT_EQ(agent.self().name, absl::StrCat("agent", rank));
  ASSERT_EQ(agent.worker_infos().size(), static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(agent.worker_infos()[r].id, r);
    EXPECT_EQ(agent.worker_infos()[r].name, absl::StrCat("agent", r));
  }
}

namespace {

// One request that timed out is held by the peer, or will be: it is
// released, its late response dropped harmlessly, and the agent keeps
// working (the next request is answered).
void expect_late_response_dropped(Agent& from, const WorkerInfo& to,
                                  HeldControl& held) {
  held.wait_for(1);
  held.release_all();
  Future<Message> next = from.send(to, ping("next"), kBound);
  held.wait_for(1);
  held.release_all();
  absl::StatusOr<Message> response = next.get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload, "next/late");
}

}  // namespace

void expect_timeout_then_working(Agent& from, const WorkerInfo& to,
                                 HeldControl& held) {
  // Connect first: setting up a connection can take longer than 200 ms on
  // a slow (e.g. sanitized) build, and this check is about a request that
  // is on the wire when its timeout ends.
  Future<Message> first = from.send(to, ping("first"), kBound);
  held.wait_for(1);
  held.release_all();
  ASSERT_THAT(first.get(absl::Now() + kBound), IsOk());
  absl::Time start = absl::Now();
  absl::StatusOr<Message> response =
      from.send(to, ping("slow"), absl::Milliseconds(200))
          .get(absl::Now() + kBound);
  EXPECT_THAT(response, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  // The request may reach the handler after the timeout.
  expect_late_response_dropped(from, to, held);
}

void expect_timed_out_before_leaving_still_delivered(Agent& from,
                                                     const WorkerInfo& to,
                                                     HeldControl& held) {
  EXPECT_THAT(from.send(to, ping("early"), absl::Microseconds(1))
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // Still delivered: the handler holds it (a test failure after kBound if
  // it never arrives).
  expect_late_response_dropped(from, to, held);
}

MessageLimits small_limits() {
  MessageLimits limits;
  limits.max_payload_bytes = 64 << 10;
  limits.max_storages = 4;
  limits.max_storage_bytes = 1 << 20;
  return limits;
}

void expect_over_limits_refused(Agent& from, const WorkerInfo& to,
                                HeldControl& held) {
  // A request the peer holds: it must survive the refusals below, which a
  // dropped connection would fail.
  Future<Message> first = from.send(to, ping("first"), kBound);
  held.wait_for(1);
  struct Over {
    const char* limit;
    Message request;
  };
  std::vector<Over> over;
  over.push_back({"max_payload_bytes", ping(std::string((64 << 10) + 1, 'p'))});
  over.push_back({"max_payload_bytes", ping(std::string(8 << 20, 'q'))});
  Message many = ping("many");
  for (int i = 0; i < 5; ++i) many.storages.push_back(make_storage(8, i));
  over.push_back({"max_storages", std::move(many)});
  Message bytes = ping("bytes");
  bytes.storages.push_back(make_storage(512 << 10, 1));
  bytes.storages.push_back(make_storage((512 << 10) + 1, 2));
  over.push_back({"max_storage_bytes", std::move(bytes)});
  Message large = ping("large");
  large.storages.push_back(make_storage(32 << 20, 3));
  over.push_back({"max_storage_bytes", std::move(large)});
  for (Over& o : over) {
    EXPECT_THAT(from.send(to, std::move(o.request), kBound)
                    .get(absl::Now() + kBound),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr(o.limit)));
  }
  EXPECT_FALSE(first.is_ready());
  held.release_all();
  absl::StatusOr<Message> answered = first.get(absl::Now() + kBound);
  ASSERT_THAT(answered, IsOk());
  EXPECT_EQ(answered->payload, "first/late");
  // At the limits exactly: served.
  Message within = ping(std::string(64 << 10, 'w'));
  for (int i = 0; i < 3; ++i) {
    within.storages.push_back(make_storage(256 << 10, i));
  }
  within.storages.push_back(make_storage(0, 9));
  Future<Message> next = from.send(to, std::move(within), kBound);
  held.wait_for(1);
  held.release_all();
  absl::StatusOr<Message> served = next.get(absl::Now() + kBound);
  ASSERT_THAT(served, IsOk());
  EXPECT_EQ(served->payload, std::string(64 << 10, 'w') + "/late");
}

void expect_shutdown_cancels(Agent& from, const WorkerInfo& to,
                             HeldControl& held) {
  std::vector<Future<Message>> pending;
  for (int i = 0; i < 10; ++i) {
    pending.push_back(from.send(to, ping("p"), kBound));
  }
  held.wait_for(10);
  from.shutdown();
  for (Future<Message>& future : pending) {
    EXPECT_THAT(future.get(absl::Now() + kBound),
                StatusIs(absl::StatusCode::kCancelled));
  }
  EXPECT_THAT(from.send(to, ping("after"), kBound).get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled));
  from.shutdown();  // idempotent
}

void expect_served_after_start(Agent& sender, Agent& receiver) {
  ASSERT_THAT(sender.start(echo), IsOk());
  Message request = ping("early");
  request.storages.push_back(make_storage(1 << 20, 3));
  Future<Message> early =
      sender.send(receiver.self(), std::move(request), kBound);
  // Not answered while the receiver has no handler.
  EXPECT_THAT(early.wait(absl::Now() + absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_THAT(receiver.start(echo), IsOk());
  absl::StatusOr<Message> response = early.get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload, "early/pong");
  ASSERT_EQ(response->storages.size(), 1u);
  EXPECT_TRUE(storage_matches(response->storages[0], 1 << 20, 3));
  EXPECT_THAT(receiver.start(echo),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

void expect_shutdown_inside_handler_is_safe(Agent& caller, Agent& callee) {
  ASSERT_THAT(caller.start(echo), IsOk());
  Agent* agent = &callee;
  ASSERT_THAT(callee.start([agent](Message request) {
    agent->shutdown();
    return echo(std::move(request));
  }),
              IsOk());
  absl::StatusOr<Message> response =
      caller.send(callee.self(), ping("bye"), kBound).get(absl::Now() + kBound);
  // The response may or may not have left before the connection closed.
  if (!response.ok()) {
    EXPECT_THAT(response, StatusIs(absl::StatusCode::kUnavailable));
  }
  EXPECT_THAT(
      callee.send(caller.self(), ping("x"), kBound).get(absl::Now() + kBound),
      StatusIs(absl::StatusCode::kCancelled));
  callee.shutdown();
}

void expect_peer_shutdown_fails_pending(Agent& from, Agent& to,
                                        HeldControl& held) {
  std::vector<Future<Message>> pending;
  for (int i = 0; i < 3; ++i) {
    // No timeout: only the loss of the peer can end them.
    pending.push_back(
        from.send(to.self(), ping("p"), absl::InfiniteDuration()));
  }
  held.wait_for(3);
  const absl::Time start = absl::Now();
  to.shutdown();
  for (Future<Message>& future : pending) {
    EXPECT_THAT(
        future.get(absl::Now() + kBound),
        StatusIs(absl::StatusCode::kUnavailable, HasSubstr(to.self().name)));
  }
  // Seen at once (a closed connection, a goodbye), not by a timeout.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(
      from.send(to.self(), ping("again"), kBound).get(absl::Now() + kBound),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr(to.self().name)));
}

}  // namespace tether::testing
