// What is specific to the tensorpipe backend; the Agent contract itself is
// checked by the conformance suite (tensorpipe_agent_test.cc).
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/tensorpipe/tensorpipe_agent.h"
#include "core/agent.h"
#include "testing/agent_checks.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::backends {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tether::testing::echo;
using ::tether::testing::HeldResponses;
using ::tether::testing::IsOk;
using ::tether::testing::kBound;
using ::tether::testing::make_storage;
using ::tether::testing::ping;
using ::tether::testing::StatusIs;
using ::tether::testing::storage_matches;
using Settings = ::tether::testing::AgentGroup::Settings;

// `size` tensorpipe agents meeting in this process.
class Group : public ::tether::testing::AgentGroup {
 public:
  Group(int size, Settings settings, std::vector<int> create = {})
      : AgentGroup(tensorpipe_backend(), size, std::move(settings),
                   std::move(create)) {}
};

absl::Status create_status(const Settings& settings) {
  Group group(1, settings);
  return group.error(0);
}

// A round trip with a payload and storages of several sizes.
void expect_round_trip(Group& group, size_t big) {
  Message request = ping("trip");
  request.storages.push_back(make_storage(big, 1));
  request.storages.push_back(make_storage(0, 2));
  request.storages.push_back(make_storage(17, 3));
  absl::StatusOr<Message> response =
      group[0]
          .send(group[1].self(), std::move(request), kBound)
          .get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload, "trip/pong");
  ASSERT_EQ(response->storages.size(), 3u);
  EXPECT_TRUE(storage_matches(response->storages[0], big, 1));
  EXPECT_TRUE(storage_matches(response->storages[1], 0, 2));
  EXPECT_TRUE(storage_matches(response->storages[2], 17, 3));
}

TEST(TensorPipeBackend, IsNamedTensorPipeAndViableHere) {
  Backend backend = tensorpipe_backend();
  EXPECT_EQ(backend.name, "tensorpipe");
  EXPECT_THAT(backend.viable(), IsOk());
}

TEST(TensorPipeBackend, UvAndBasicOnlyStillRoundTrip) {
  Group group(
      2, {{"tensorpipe.transports", "uv"}, {"tensorpipe.channels", "basic"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, 1 << 20);
}

// The default transport is tether's guarded tcp; 8 MiB exercises reads
// straight into the destination.
TEST(TensorPipeBackend, TcpAndBasicOnlyRoundTrip) {
  Group group(
      2, {{"tensorpipe.transports", "tcp"}, {"tensorpipe.channels", "basic"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, 8 << 20);
}

// The lanes are tether's tcp transport whatever carries the pipes.
TEST(TensorPipeBackend, MptLanesRoundTrip) {
  Group group(2, {{"tensorpipe.transports", "uv"},
                  {"tensorpipe.channels", "mpt"},
                  {"tensorpipe.mpt_lanes", "3"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, 8 << 20);
}

TEST(TensorPipeBackend, ShmAndCmaOnlyRoundTrip) {
  Group group(
      2, {{"tensorpipe.transports", "shm"}, {"tensorpipe.channels", "cma"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, 4 << 20);
}

TEST(TensorPipeBackend, XthChannelRoundTripsWithinOneProcess) {
  Group group(2, {{"tensorpipe.channels", "xth, basic"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, 1 << 20);
}

TEST(TensorPipeBackend, ListensOnANamedInterface) {
  Group group(2, {{"tensorpipe.address", "lo"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, 1000);
}

// By default only the guarded tcp transport listens (issue #16).
TEST(TensorPipeBackend, PublishesItsAddressesInTheStore) {
  Group group(2, {});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  std::vector<uint8_t> bytes = group.store().get("tether/tensorpipe/1");
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_THAT(text, HasSubstr("tcp=127.0.0.1:"));
  EXPECT_THAT(text, Not(HasSubstr("uv=")));
  EXPECT_THAT(text, Not(HasSubstr("shm=")));
}

TEST(TensorPipeBackend, TensorPipesOwnTransportsOnRequest) {
  Group group(2, {{"tensorpipe.transports", "tcp,uv,shm"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  std::vector<uint8_t> bytes = group.store().get("tether/tensorpipe/1");
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_THAT(text, HasSubstr("tcp=127.0.0.1:"));
  EXPECT_THAT(text, HasSubstr("uv=127.0.0.1:"));
  EXPECT_THAT(text, HasSubstr("shm="));
  expect_round_trip(group, 1 << 20);
}

TEST(TensorPipeBackend, UnknownTransportIsInvalidArgument) {
  EXPECT_THAT(create_status({{"tensorpipe.transports", "uv,carrier_pigeon"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("carrier_pigeon")));
}

TEST(TensorPipeBackend, UnknownChannelIsInvalidArgument) {
  EXPECT_THAT(
      create_status({{"tensorpipe.channels", "basic,cuda_ipc"}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cuda_ipc")));
}

TEST(TensorPipeBackend, BadSettingValuesAreInvalidArgument) {
  for (const Settings& settings : std::vector<Settings>{
           {{"tensorpipe.transports", " , "}},
           {{"tensorpipe.mpt_lanes", "0"}},
           {{"tensorpipe.mpt_lanes", "two"}},
           {{"tensorpipe.init_timeout_ms", "-5"}},
           {{"tensorpipe.address", "no-such-interface0"}},
           {{"tensorpipe.transport", "uv"}},  // a typo of a known key
       }) {
    EXPECT_THAT(create_status(settings),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << settings.begin()->first << "=" << settings.begin()->second;
  }
}

TEST(TensorPipeBackend, IgnoresOtherBackendsSettings) {
  EXPECT_THAT(create_status({{"grpc.tls_cert", "/nowhere"}}), IsOk());
}

TEST(TensorPipeBackend, CreationTimesOutNamingMissingRanks) {
  Group group(3, {{"tensorpipe.init_timeout_ms", "200"}}, /*create=*/{0});
  EXPECT_THAT(group.error(0), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                       HasSubstr("rank(s) 1, 2")));
}

TEST(TensorPipeBackend, LostPeerFailsPendingRequestsWithUnavailable) {
  Group group(2, {});
  ASSERT_TRUE(group.ok());
  auto holder = std::make_shared<HeldResponses>();
  group.start_all(
      [holder](Message request) { return holder->hold(std::move(request)); });
  std::vector<Future<Message>> pending;
  for (int i = 0; i < 3; ++i) {
    pending.push_back(group[0].send(group[1].self(), ping("p"), kBound));
  }
  holder->wait_for(3);
  group[1].shutdown();
  for (Future<Message>& future : pending) {
    EXPECT_THAT(future.get(absl::Now() + kBound),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent1")));
  }
  // The broken pipe was dropped; reconnecting to a dead peer fails too.
  EXPECT_THAT(group[0]
                  .send(group[1].self(), ping("again"), kBound)
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(TensorPipeBackend, RequestsArrivingBeforeStartAreServedAfterIt) {
  Group group(2, {});
  ASSERT_TRUE(group.ok());
  ::tether::testing::expect_served_after_start(group[0], group[1]);
}

TEST(TensorPipeBackend, HandlerMaySendNestedRequests) {
  Group group(3, {});
  ASSERT_TRUE(group.ok());
  Group* g = &group;
  group.start_all([g](Message request) -> Future<Message> {
    if (!absl::StartsWith(request.payload, "fwd:"))
      return echo(std::move(request));
    // On agent1's tensorpipe thread: forward to agent2, answer with its reply.
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
  std::vector<Future<Message>> calls;
  for (int i = 0; i < 20; ++i) {
    Message request = ping(absl::StrCat("fwd:", i));
    request.storages.push_back(make_storage(100, static_cast<uint8_t>(i)));
    calls.push_back(group[0].send(group[1].self(), std::move(request), kBound));
  }
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<Message> response = calls[i].get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->payload, absl::StrCat(i, "/pong/via1"));
    ASSERT_EQ(response->storages.size(), 1u);
    EXPECT_TRUE(
        storage_matches(response->storages[0], 100, static_cast<uint8_t>(i)));
  }
}

TEST(TensorPipeBackend, ShutdownFromInsideTheHandlerDoesNotDeadlock) {
  Group group(2, {});
  ASSERT_TRUE(group.ok());
  ::tether::testing::expect_shutdown_inside_handler_is_safe(group[0],
                                                            group[1]);
  // ~Group shuts agent1 down again: it waits for the first shutdown's joins.
}

// tensorpipe fails a listener when an accepted connection dies before its
// first packet (a peer crashing mid-connect); the agent listens again on the
// addresses its peers know.
// (TensorPipe's uv transport; tether's tcp never hands such a connection to
// tensorpipe.)
TEST(TensorPipeBackend, ListenerSurvivesAConnectionThatDiesEarly) {
  Group group(3, {{"tensorpipe.transports", "uv"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  std::vector<uint8_t> bytes = group.store().get("tether/tensorpipe/1");
  const std::string text(bytes.begin(), bytes.end());
  const size_t start = text.find("uv=127.0.0.1:");
  ASSERT_NE(start, std::string::npos) << text;
  const int port = std::stoi(text.substr(start + 13));

  // A connection to agent1 that says nothing...
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(
      ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  // ...while agent0 opens its pipe, and dies.
  ASSERT_THAT(group[0]
                  .send(group[1].self(), ping("a"), kBound)
                  .get(absl::Now() + kBound),
              IsOk());
  ::close(fd);
  // Pipes already open keep working.
  ASSERT_THAT(group[0]
                  .send(group[1].self(), ping("b"), kBound)
                  .get(absl::Now() + kBound),
              IsOk());
  // A peer that connects afterwards gets through (perhaps after a refused
  // attempt while agent1 listens again).
  absl::Time deadline = absl::Now() + kBound;
  absl::StatusOr<Message> response;
  do {
    response = group[2].send(group[1].self(), ping("c"), kBound).get(deadline);
  } while (!response.ok() &&
           response.status().code() == absl::StatusCode::kUnavailable &&
           absl::Now() < deadline);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload, "c/pong");
}

}  // namespace
}  // namespace tether::backends
