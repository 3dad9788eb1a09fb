// What is specific to the gRPC backend: a port in use, shared streams,
// chunking, limits, broken and silent connections, strangers and garbage on
// streams. The Agent contract, creation and settings are checked by the
// conformance suites (grpc_agent_test.cc, grpc_agent_multiprocess_test.cc,
// grpc_creation_test.cc).
// Faults are real: a TCP proxy between two agents breaks or silences their
// connection, a raw gRPC client sends what a stranger or a broken peer would.
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/grpc/grpc_agent.h"
#include "backends/grpc/grpc_testing.h"
#include "core/agent.h"
#include "core/auth/auth.h"
#include "core/future.h"
#include "core/rendezvous.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::backends::grpc_backend;
using ::tether::backends::grpc_testing::create_agents;
using ::tether::backends::grpc_testing::meet_group;
using ::tether::backends::grpc_testing::published_address;
using ::tether::backends::grpc_testing::raw_stream;
using ::tether::backends::grpc_testing::TcpProxy;

absl::StatusOr<Message> call(Agent& from, const Agent& to, Message request,
                             absl::Duration timeout = kBound) {
  return from.send(to.self(), std::move(request), timeout)
      .get(absl::Now() + kBound);
}

// Holds PINGs whose payload starts with "hold", echoes the others.
RequestHandler hold_some(std::shared_ptr<HeldResponses> held) {
  return [held](Message request) {
    if (absl::StartsWith(request.payload, "hold")) {
      return held->hold(std::move(request));
    }
    return echo(std::move(request));
  };
}

TEST(GrpcBackend, APortInUseIsInvalidArgument) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length),
            0);
  const std::string taken = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
  EXPECT_THAT(create_status(grpc_backend(), {{"grpc.address", taken}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(taken), HasSubstr("grpc.address"))));
  ::close(fd);
}

TEST(GrpcBackend, LargeMessageDoesNotHoldUpSmallOnes) {
  AgentGroup group(grpc_backend(), 2, {{"grpc.chunk_bytes", "65536"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  Message big = ping("big");
  big.storages.push_back(make_storage(64 << 20, 5));
  std::atomic<int> order{0};
  std::atomic<int> big_done{0};
  std::atomic<int> small_done{0};
  Future<Message> big_call =
      group[0].send(group[1].self(), std::move(big), kBound);
  big_call.on_complete(
      [&](const absl::StatusOr<Message>&) { big_done = ++order; });
  Message small = ping("small");
  small.storages.push_back(make_storage(100 << 10, 6));
  Future<Message> small_call =
      group[0].send(group[1].self(), std::move(small), kBound);
  small_call.on_complete(
      [&](const absl::StatusOr<Message>&) { small_done = ++order; });
  absl::StatusOr<Message> small_response = small_call.get(absl::Now() + kBound);
  absl::StatusOr<Message> big_response = big_call.get(absl::Now() + kBound);
  ASSERT_THAT(small_response, IsOk());
  ASSERT_THAT(big_response, IsOk());
  EXPECT_TRUE(storage_matches(big_response->storages[0], 64 << 20, 5));
  EXPECT_TRUE(storage_matches(small_response->storages[0], 100 << 10, 6));
  EXPECT_LT(small_done.load(), big_done.load());
}

TEST(GrpcBackend, MessagesOverTheLimitAreResourceExhausted) {
  AgentGroup group(grpc_backend(), 2, {{"grpc.max_message_bytes", "1048576"}});
  ASSERT_TRUE(group.ok());
  group.start_all([](Message request) -> Future<Message> {
    if (request.payload != "grow") return echo(std::move(request));
    Message response;
    response.type = MessageType::kPong;
    response.storages.push_back(make_storage(2 << 20, 1));
    return Future<Message>::ready(std::move(response));
  });
  Message large = ping("large");
  large.storages.push_back(make_storage(2 << 20, 1));
  // The sender refuses its own, before it leaves.
  EXPECT_THAT(call(group[0], group[1], std::move(large)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("grpc.max_message_bytes")));
  // A response over the limit becomes an error for the caller.
  EXPECT_THAT(call(group[0], group[1], ping("grow")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("response"), HasSubstr("agent1"))));
  // The stream goes on.
  EXPECT_THAT(call(group[0], group[1], ping("fine")), IsOk());
}

// Agents 0 and 1 of a group of two in this process, both started with
// `echo`, rank r with `settings[r]` and both with `busy_poll`.
struct EchoPair {
  std::vector<RendezvousResult> members;
  std::vector<absl::StatusOr<std::unique_ptr<Agent>>> agents;
  Agent& a() { return **agents[0]; }
  Agent& b() { return **agents[1]; }
};

void make_echo_pair(EchoPair& out, const std::vector<AgentSettings>& settings,
                    absl::Duration busy_poll = absl::ZeroDuration()) {
  out.members = meet_group(2);
  ASSERT_EQ(out.members.size(), 2u);
  out.agents = create_agents(out.members, settings, busy_poll);
  ASSERT_THAT(out.agents[0], IsOk());
  ASSERT_THAT(out.agents[1], IsOk());
  ASSERT_THAT(out.a().start(echo), IsOk());
  ASSERT_THAT(out.b().start(echo), IsOk());
}

TEST(GrpcBackend, ReceiverRefusesMessagesOverItsOwnLimit) {
  EchoPair pair;
  ASSERT_NO_FATAL_FAILURE(
      make_echo_pair(pair, {{{"grpc.max_message_bytes", "67108864"}},
                            {{"grpc.max_message_bytes", "1048576"}}}));
  Agent& a = pair.a();
  Agent& b = pair.b();
  Message large = ping("large");
  large.storages.push_back(make_storage(2 << 20, 1));
  EXPECT_THAT(call(a, b, std::move(large)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("receiver's limit")));
  EXPECT_THAT(call(a, b, ping("fine")), IsOk());
}

// Agents 0 and 1 where agent0 reaches agent1 through `proxy` (agent1 dials
// agent0 directly, but has no reason to: it answers on agent0's stream).
struct Proxied {
  std::vector<RendezvousResult> members;
  std::unique_ptr<TcpProxy> proxy;
  std::unique_ptr<Agent> agents[2];
};

void make_proxied(Proxied& out, const AgentGroup::Settings& settings) {
  out.members = meet_group(2);
  ASSERT_EQ(out.members.size(), 2u);
  absl::StatusOr<std::unique_ptr<Agent>> second;
  std::thread creating([&] {
    second = ::tether::testing::create_agent(grpc_backend(), out.members[1],
                                             settings);
  });
  // agent1 has published; agent0 reads the proxy's address in its place.
  out.members[0].store->wait({"tether/grpc/1"});
  out.proxy = std::make_unique<TcpProxy>(published_address(out.members[0], 1));
  const std::string address = out.proxy->address();
  out.members[0].store->set(
      "tether/grpc/1", std::vector<uint8_t>(address.begin(), address.end()));
  absl::StatusOr<std::unique_ptr<Agent>> first =
      ::tether::testing::create_agent(grpc_backend(), out.members[0], settings);
  creating.join();
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  out.agents[0] = *std::move(first);
  out.agents[1] = *std::move(second);
}

TEST(GrpcBackend, BrokenConnectionFailsPendingCallsThenReconnects) {
  Proxied p;
  ASSERT_NO_FATAL_FAILURE(make_proxied(p, {}));
  auto held = std::make_shared<HeldResponses>();
  ASSERT_THAT(p.agents[0]->start(echo), IsOk());
  ASSERT_THAT(p.agents[1]->start(hold_some(held)), IsOk());
  std::vector<Future<Message>> pending;
  for (int i = 0; i < 3; ++i) {
    // No timeout: only the loss of the connection can end them.
    pending.push_back(p.agents[0]->send(p.agents[1]->self(), ping("hold"),
                                        absl::InfiniteDuration()));
  }
  held->wait_for(3);
  const absl::Time cut = absl::Now();
  p.proxy->cut();
  for (Future<Message>& future : pending) {
    EXPECT_THAT(future.get(absl::Now() + kBound),
                StatusIs(absl::StatusCode::kUnavailable,
                         AllOf(HasSubstr("agent0"), HasSubstr("agent1"))));
  }
  std::printf("calls on the broken connection failed after %s\n",
              absl::FormatDuration(absl::Now() - cut).c_str());
  // The next call opens a new connection (through the proxy again).
  absl::StatusOr<Message> again =
      call(*p.agents[0], *p.agents[1], ping("again"));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->payload, "again/pong");
  // Responses to the failed calls have nowhere to go; they are dropped.
  held->release_all();
  EXPECT_THAT(call(*p.agents[0], *p.agents[1], ping("still")), IsOk());
}

TEST(GrpcBackend, PeersShareOneStreamBothWays) {
  Proxied p;
  ASSERT_NO_FATAL_FAILURE(make_proxied(p, {}));
  auto held = std::make_shared<HeldResponses>();
  ASSERT_THAT(p.agents[0]->start(hold_some(held)), IsOk());
  ASSERT_THAT(p.agents[1]->start(echo), IsOk());
  // agent0 opens the stream, through the proxy.
  ASSERT_THAT(call(*p.agents[0], *p.agents[1], ping("open")), IsOk());
  // agent1's request travels on that stream: agent1 does not dial agent0
  // (whose address it has directly), so cutting the proxy fails it.
  Future<Message> back = p.agents[1]->send(p.agents[0]->self(), ping("hold"),
                                           absl::InfiniteDuration());
  held->wait_for(1);
  p.proxy->cut();
  EXPECT_THAT(back.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent0")));
  held->release_all();
}

// The voluntary context switches of every thread of this process so far:
// each is a sleep.
int64_t sleeps_of_this_process() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_nvcsw;
}

// Sleeps of this process (both agents, their queue threads, the caller) for
// `calls` round trips from agent 0 to agent 1 on an open stream: the fewest
// of three rounds, so that only a load lasting all three counts.
int64_t sleeps_for_calls(Agent& from, const Agent& to, int calls) {
  int64_t fewest = -1;
  for (int round = 0; round < 3; ++round) {
    const int64_t before = sleeps_of_this_process();
    for (int i = 0; i < calls; ++i) {
      EXPECT_THAT(call(from, to, ping("spin")), IsOk());
    }
    const int64_t sleeps = sleeps_of_this_process() - before;
    if (fewest < 0 || sleeps < fewest) fewest = sleeps;
  }
  return fewest;
}

// With AgentSetup::busy_poll (RpcOptions::busy_poll) each agent's queue
// thread polls its completion queue before it sleeps, and the caller polls
// its future: a round trip whose answer comes within the poll puts no thread
// to sleep. With only the caller polling, the queue threads sleep for every
// request, answer and write (about three sleeps a call). The count is the
// kernel's, not a clock: a loaded machine preempts threads (involuntary).
// It does make a few sleep: a thread that finds a lock held by one that was
// preempted waits for it. So polling is compared with not polling in the
// same minute, as a ratio, not with a fixed count.
TEST(GrpcBackend, BusyPollingQueueThreadsDoNotSleepBetweenCalls) {
  constexpr int kCalls = 50;
  struct Restore {
    ~Restore() { ::tether::internal::reset_wait_polling(); }
  } restore;  // process-wide: the next tests sleep
  ::tether::internal::poll_waits_with(PollPolicy{absl::Seconds(1), false});
  int64_t sleeps[2] = {0, 0};
  const absl::Duration busy_poll[2] = {absl::ZeroDuration(),
                                       absl::Milliseconds(200)};
  for (int polling = 0; polling < 2; ++polling) {
    EchoPair pair;
    ASSERT_NO_FATAL_FAILURE(make_echo_pair(pair, {{}, {}}, busy_poll[polling]));
    ASSERT_THAT(call(pair.a(), pair.b(), ping("open")), IsOk());
    sleeps[polling] = sleeps_for_calls(pair.a(), pair.b(), kCalls);
  }
  std::printf("%d calls: slept %lld times polling, %lld without\n", kCalls,
              static_cast<long long>(sleeps[1]),
              static_cast<long long>(sleeps[0]));
  EXPECT_GE(sleeps[0], kCalls) << "without the queues polling";
  EXPECT_LT(sleeps[1] * 5, sleeps[0])
      << "slept " << sleeps[1] << " times polling, " << sleeps[0] << " without";
}

TEST(GrpcBackend, SilentPeerIsLostWhenKeepaliveFails) {
  Proxied p;
  ASSERT_NO_FATAL_FAILURE(make_proxied(
      p, {{"grpc.keepalive_ms", "200"}, {"grpc.keepalive_timeout_ms", "300"}}));
  auto held = std::make_shared<HeldResponses>();
  ASSERT_THAT(p.agents[0]->start(echo), IsOk());
  ASSERT_THAT(p.agents[1]->start(hold_some(held)), IsOk());
  Future<Message> pending = p.agents[0]->send(p.agents[1]->self(), ping("hold"),
                                              absl::InfiniteDuration());
  held->wait_for(1);
  // The connection stays open but carries nothing: only keepalive notices.
  const absl::Time silenced = absl::Now();
  p.proxy->blackhole();
  EXPECT_THAT(pending.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent1")));
  const absl::Duration took = absl::Now() - silenced;
  std::printf("the silent peer was lost after %s\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_THAT(call(*p.agents[0], *p.agents[1], ping("again")), IsOk());
  held->release_all();
}

TEST(GrpcBackend, StreamsFromStrangersAreRefused) {
  AgentGroup group(grpc_backend(), 2, {});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  std::vector<uint8_t> bytes = group.store().get("tether/grpc/1");
  const std::string agent1(bytes.begin(), bytes.end());
  auto insecure = ::grpc::InsecureChannelCredentials();
  for (const std::map<std::string, std::string>& metadata :
       std::vector<std::map<std::string, std::string>>{
           {},
           {{"tether-from-rank", "0"},
            {"tether-from-name", "mallory"},
            {"tether-to-name", "agent1"}},
           {{"tether-from-rank", "7"},
            {"tether-from-name", "agent0"},
            {"tether-to-name", "agent1"}},
           {{"tether-from-rank", "0"},
            {"tether-from-name", "agent0"},
            {"tether-to-name", "agent9"}},
       }) {
    ::grpc::Status status = raw_stream(agent1, insecure, metadata, {"hello"});
    EXPECT_EQ(status.error_code(), ::grpc::StatusCode::FAILED_PRECONDITION)
        << status.error_message();
  }
  EXPECT_THAT(call(group[0], group[1], ping("fine")), IsOk());
}

// A stranger that opens a stream claiming to be agent0 and then says
// nothing (no hello, no proof) holds it only until grpc.auth_timeout_ms; the
// agent refuses it with UNAUTHENTICATED and goes on serving agent0 itself.
TEST(GrpcBackend, AStreamThatNeverAuthenticatesIsRefusedInTime) {
  absl::StatusOr<std::optional<auth::Authenticator>> authenticator =
      auth::Authenticator::from("the-group-secret-0123456789");
  ASSERT_THAT(authenticator, IsOk());
  std::vector<RendezvousResult> members = meet_group(2);
  std::vector<std::unique_ptr<Agent>> agents(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      AgentSetup setup;
      setup.self = members[rank].self;
      setup.workers = members[rank].workers;
      setup.store = members[rank].store;
      setup.group_key = members[rank].group_key;
      setup.settings = {{"grpc.auth_timeout_ms", "300"}};
      setup.auth = *authenticator;
      absl::StatusOr<std::unique_ptr<Agent>> agent =
          grpc_backend().create(std::move(setup));
      EXPECT_THAT(agent, IsOk());
      if (agent.ok()) agents[rank] = *std::move(agent);
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_NE(agents[0], nullptr);
  ASSERT_NE(agents[1], nullptr);
  ASSERT_THAT(agents[0]->start(echo), IsOk());
  ASSERT_THAT(agents[1]->start(echo), IsOk());
  const std::map<std::string, std::string> as_agent0 = {
      {"tether-from-rank", "0"},
      {"tether-from-name", "agent0"},
      {"tether-to-name", "agent1"}};
  const absl::Time began = absl::Now();
  ::grpc::Status status =
      raw_stream(published_address(members[0], 1),
                 ::grpc::InsecureChannelCredentials(), as_agent0, {},
                 /*writes_done=*/false);
  const absl::Duration took = absl::Now() - began;
  EXPECT_EQ(status.error_code(), ::grpc::StatusCode::UNAUTHENTICATED)
      << status.error_message();
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("agent0"),
                    HasSubstr("did not authenticate within 300ms")));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, kBound);
  EXPECT_THAT(call(*agents[0], *agents[1], ping("fine")), IsOk());
  EXPECT_THAT(call(*agents[1], *agents[0], ping("back")), IsOk());
  agents[0]->shutdown();
  agents[1]->shutdown();
}

TEST(GrpcBackend, GarbageOnAStreamClosesItAndNothingElse) {
  AgentGroup group(grpc_backend(), 2, {});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  ASSERT_THAT(call(group[0], group[1], ping("before")), IsOk());
  std::vector<uint8_t> bytes = group.store().get("tether/grpc/1");
  const std::string agent1(bytes.begin(), bytes.end());
  const std::map<std::string, std::string> as_agent0 = {
      {"tether-from-rank", "0"},
      {"tether-from-name", "agent0"},
      {"tether-to-name", "agent1"}};
  for (const std::vector<std::string>& messages :
       std::vector<std::vector<std::string>>{
           {"not a frame at all"},
           // A well-formed chunk of a message that never began.
           {std::string("TGF1\x04\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00",
                        16) +
            std::string(24, '\0') + std::string(8, 'x')},
           {std::string(5000, '\xff')},
       }) {
    ::grpc::Status status = raw_stream(
        agent1, ::grpc::InsecureChannelCredentials(), as_agent0, messages);
    EXPECT_EQ(status.error_code(), ::grpc::StatusCode::UNAVAILABLE)
        << status.error_message();
  }
  EXPECT_THAT(call(group[0], group[1], ping("after")), IsOk());
  EXPECT_THAT(call(group[1], group[0], ping("back")), IsOk());
}

}  // namespace
}  // namespace tether::testing
