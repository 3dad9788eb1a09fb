// What the faulty backend adds: failed, dropped and delayed sends, and its
// settings. The Agent contract and bad settings are checked by the
// conformance suite (faulty_agent_test.cc).
#include <absl/synchronization/mutex.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/faulty/faulty_agent.h"
#include "backends/loopback/loopback_agent.h"
#include "core/agent.h"
#include "core/backend_registry.h"
#include "core/future.h"
#include "core/message.h"
// The RRef layer names its message types, which the settings below use.
#include "rref/messages.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::backends::faulty_backend;
using ::tether::backends::loopback_backend;

const BackendRegistry& inner_registry() {
  static const BackendRegistry* const registry = [] {
    auto* r = new BackendRegistry;
    (void)r->add(loopback_backend());
    return r;
  }();
  return *registry;
}

// `size` faulty agents over loopback with the faults in `settings`.
class Group : public ::tether::testing::AgentGroup {
 public:
  Group(int size, Settings settings)
      : AgentGroup(faulty_backend(&inner_registry()), size,
                   with_inner(std::move(settings))) {}

 private:
  static Settings with_inner(Settings settings) {
    settings.emplace("faulty.inner", "loopback");
    return settings;
  }
};

absl::Status create_status(const AgentGroup::Settings& settings) {
  return ::tether::testing::create_status(faulty_backend(&inner_registry()),
                                          settings);
}

// An echo handler that records what reached it, and when.
class Recorder {
 public:
  RequestHandler handler() {
    return [this](Message request) {
      {
        absl::MutexLock lock(&mu_);
        arrivals_.push_back({request.type, request.payload, absl::Now()});
      }
      return echo(std::move(request));
    };
  }

  struct Arrival {
    MessageType type;
    std::string payload;
    absl::Time at;
  };

  std::vector<Arrival> arrivals() {
    absl::MutexLock lock(&mu_);
    return arrivals_;
  }

  std::vector<std::string> payloads() {
    std::vector<std::string> out;
    for (const Arrival& a : arrivals()) out.push_back(a.payload);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<Arrival> arrivals_ ABSL_GUARDED_BY(mu_);
};

Message call(std::string payload) {
  Message message = ping(std::move(payload));
  message.type = MessageType::kCall;
  return message;
}

absl::StatusOr<Message> send_and_wait(Agent& from, const WorkerInfo& to,
                                      Message message,
                                      absl::Duration timeout = kBound) {
  return from.send(to, std::move(message), timeout).get(absl::Now() + kBound);
}

// Bad values of each setting: the creation area of the conformance suite
// (faulty_agent_test.cc).
TEST(FaultyBackend, TheInnerBackendMustBeNamedAndKnown) {
  EXPECT_THAT(create_status({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("faulty.inner")));
  EXPECT_THAT(create_status({{"faulty.inner", "nowhere"}}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("faulty.inner"), HasSubstr("nowhere"))));
}

TEST(FaultyBackend, GoodSettingsAndOtherBackendsKeysAreAccepted) {
  EXPECT_THAT(
      create_status({{"faulty.inner", "loopback"},
                     {"faulty.fail", "RREF_USER_DELETE:2, RREF_FORK_REQUEST:1"},
                     {"faulty.drop", "RREF_CHILD_ACCEPT:0"},
                     {"faulty.delay", "PING:5"},
                     {"faulty.drop_bound_ms", "100"},
                     {"tensorpipe.transports", "uv"}}),
      IsOk());
}

TEST(FaultyBackend, FailsTheFirstNSendsOfATypeWithoutSendingThem) {
  Group group(2, {{"faulty.fail", "PING:2"}});
  ASSERT_TRUE(group.ok());
  Recorder recorder;
  group.start_all(recorder.handler());
  for (const char* payload : {"a", "b"}) {
    EXPECT_THAT(send_and_wait(group[0], group[1].self(), ping(payload)),
                StatusIs(absl::StatusCode::kUnavailable,
                         AllOf(HasSubstr("PING"), HasSubstr("agent1"),
                               HasSubstr("faulty.fail"))));
  }
  // Other types pass.
  EXPECT_THAT(send_and_wait(group[0], group[1].self(), call("call")), IsOk());
  absl::StatusOr<Message> third =
      send_and_wait(group[0], group[1].self(), ping("c"));
  ASSERT_THAT(third, IsOk());
  EXPECT_EQ(third->payload, "c/pong");
  EXPECT_THAT(recorder.payloads(), ::testing::ElementsAre("call", "c"));
}

TEST(FaultyBackend, EachAgentCountsItsOwnSends) {
  Group group(2, {{"faulty.fail", "PING:1"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  for (int rank = 0; rank < 2; ++rank) {
    const WorkerInfo peer = group[1 - rank].self();
    EXPECT_THAT(send_and_wait(group[rank], peer, ping("x")),
                StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(send_and_wait(group[rank], peer, ping("y")), IsOk());
  }
}

TEST(FaultyBackend, DropsTheFirstNSendsUntilTheSendersTimeout) {
  Group group(2, {{"faulty.drop", "PING:1"}});
  ASSERT_TRUE(group.ok());
  Recorder recorder;
  group.start_all(recorder.handler());
  const absl::Duration timeout = absl::Milliseconds(150);
  const absl::Time start = absl::Now();
  Future<Message> dropped =
      group[0].send(group[1].self(), ping("lost"), timeout);
  EXPECT_THAT(dropped.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("agent1"), HasSubstr("dropped"))));
  EXPECT_GE(absl::Now() - start, timeout);
  absl::StatusOr<Message> next =
      send_and_wait(group[0], group[1].self(), ping("kept"), timeout);
  ASSERT_THAT(next, IsOk());
  EXPECT_THAT(recorder.payloads(), ::testing::ElementsAre("kept"));
}

TEST(FaultyBackend, ADroppedSendWithoutTimeoutFailsAfterTheDropBound) {
  Group group(2, {{"faulty.drop", "PING:1"}, {"faulty.drop_bound_ms", "100"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  const absl::Time start = absl::Now();
  EXPECT_THAT(group[0]
                  .send(group[1].self(), ping("lost"), absl::InfiniteDuration())
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("without a timeout"),
                             HasSubstr("faulty.drop_bound_ms"))));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
}

TEST(FaultyBackend, DelaysEverySendOfAType) {
  Group group(2, {{"faulty.delay", "PING:100"}});
  ASSERT_TRUE(group.ok());
  Recorder recorder;
  group.start_all(recorder.handler());
  for (int i = 0; i < 3; ++i) {
    const absl::Time sent = absl::Now();
    absl::StatusOr<Message> response =
        send_and_wait(group[0], group[1].self(), ping("late"));
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->payload, "late/pong");
    std::vector<Recorder::Arrival> arrivals = recorder.arrivals();
    ASSERT_EQ(arrivals.size(), static_cast<size_t>(i + 1));
    EXPECT_GE(arrivals.back().at - sent, absl::Milliseconds(100));
  }
}

TEST(FaultyBackend, ADelayThatOutlastsTheTimeoutIsDeadlineExceededAndStillSent) {
  Group group(2, {{"faulty.delay", "PING:1500"}});
  ASSERT_TRUE(group.ok());
  Recorder recorder;
  group.start_all(recorder.handler());
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      send_and_wait(group[0], group[1].self(), ping("late"),
                    absl::Milliseconds(100)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("delayed")));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1400));
  EXPECT_TRUE(recorder.arrivals().empty());
  // A timeout ends the sender's wait, not the delivery: it arrives after
  // its delay (and its answer is dropped).
  const absl::Time deadline = absl::Now() + kBound;
  while (recorder.arrivals().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::vector<Recorder::Arrival> arrivals = recorder.arrivals();
  ASSERT_EQ(arrivals.size(), 1u);
  EXPECT_EQ(arrivals[0].payload, "late");
  EXPECT_GE(arrivals[0].at - start, absl::Milliseconds(1500));
  // The agent goes on.
  EXPECT_THAT(send_and_wait(group[0], group[1].self(), ping("next")), IsOk());
}

TEST(FaultyBackend, FailBeforeDropBeforeDelay) {
  Group group(2, {{"faulty.fail", "PING:1"},
                  {"faulty.drop", "PING:1"},
                  {"faulty.delay", "PING:50"}});
  ASSERT_TRUE(group.ok());
  Recorder recorder;
  group.start_all(recorder.handler());
  const absl::Duration timeout = absl::Milliseconds(100);
  EXPECT_THAT(send_and_wait(group[0], group[1].self(), ping("1"), timeout),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(send_and_wait(group[0], group[1].self(), ping("2"), timeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  const absl::Time sent = absl::Now();
  EXPECT_THAT(send_and_wait(group[0], group[1].self(), ping("3")), IsOk());
  std::vector<Recorder::Arrival> arrivals = recorder.arrivals();
  ASSERT_EQ(arrivals.size(), 1u);
  EXPECT_EQ(arrivals[0].payload, "3");
  EXPECT_GE(arrivals[0].at - sent, absl::Milliseconds(50));
}

TEST(FaultyBackend, ShutdownCancelsDroppedAndDelayedSends) {
  Group group(2, {{"faulty.drop", "PING:1"}, {"faulty.delay", "CALL:60000"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  Future<Message> dropped = group[0].send(group[1].self(), ping("d"), kBound);
  Future<Message> delayed =
      group[0].send(group[1].self(), call("c"), absl::InfiniteDuration());
  group[0].shutdown();
  EXPECT_THAT(dropped.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(delayed.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(group[0]
                  .send(group[1].self(), ping("after"), kBound)
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST(FaultyBackend, JoinWaitsForDelayedSends) {
  Group group(2, {{"faulty.delay", "PING:200"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  Future<Message> delayed = group[0].send(group[1].self(), ping("d"), kBound);
  std::vector<absl::Status> joined(2);
  std::vector<std::thread> joiners;
  for (int rank = 0; rank < 2; ++rank) {
    joiners.emplace_back(
        [&, rank] { joined[rank] = group[rank].join(kBound); });
  }
  for (std::thread& joiner : joiners) joiner.join();
  EXPECT_THAT(joined[0], IsOk());
  EXPECT_THAT(joined[1], IsOk());
  // Both joins ended only once the delayed request was answered.
  ASSERT_TRUE(delayed.is_ready());
  EXPECT_THAT(delayed.result(), IsOk());
}

TEST(FaultyBackend, JoinTimesOutWhileASendIsHeld) {
  Group group(2, {{"faulty.drop", "PING:1"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  Future<Message> dropped = group[0].send(group[1].self(), ping("d"), kBound);
  EXPECT_THAT(
      group[0].join(absl::Milliseconds(100)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("faulty")));
}

}  // namespace
}  // namespace tether::testing
