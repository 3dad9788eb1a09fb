// What is specific to the libfabric backend: providers, both rendezvous
// modes, flow control, the registration cache, limits before pulling,
// liveness. The Agent contract, creation and settings are checked by the
// conformance suites (libfabric_*_agent_test.cc, libfabric_creation_test.cc).
// Every test runs on real endpoints of both providers that run here
// (tcp;ofi_rxm and shm), and is skipped, saying why, for a provider this
// machine lacks.
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/libfabric/libfabric_agent.h"
#include "core/agent.h"
#include "testing/agent_testing.h"
#include "testing/multiprocess.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::backends::libfabric_backend;
using ::tether::backends::libfabric_stats;
using ::tether::backends::LibfabricStats;

// `size` libfabric agents meeting in this process, on `provider`.
class Group : public ::tether::testing::AgentGroup {
 public:
  Group(const std::string& provider, int size, Settings settings = {},
        std::vector<int> create = {})
      : AgentGroup(libfabric_backend({{"libfabric.provider", provider}}), size,
                   std::move(settings), std::move(create)) {}
};

LibfabricStats stats_of(Agent& agent) {
  absl::StatusOr<LibfabricStats> stats = libfabric_stats(agent);
  EXPECT_THAT(stats, IsOk());
  return stats.ok() ? *stats : LibfabricStats();
}

// The provider under test; skips the test when it is absent here.
class Provider : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const absl::Status viable =
        libfabric_backend({{"libfabric.provider", GetParam()}}).viable();
    if (!viable.ok()) GTEST_SKIP() << viable;
  }
};

INSTANTIATE_TEST_SUITE_P(Providers, Provider,
                         ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           return info.param == "shm" ? "Shm" : "Tcp";
                         });

// A request with a payload of `payload` bytes and storages of `sizes`
// bytes goes to agent 1 and comes back intact.
void expect_round_trip(Group& group, size_t payload,
                       const std::vector<size_t>& sizes) {
  Message request = ping(std::string(payload, 'p'));
  for (size_t i = 0; i < sizes.size(); ++i) {
    request.storages.push_back(make_storage(sizes[i], static_cast<uint8_t>(i)));
  }
  absl::StatusOr<Message> response =
      group[0]
          .send(group[1].self(), std::move(request), kBound)
          .get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload.size(), payload + 5);
  EXPECT_EQ(response->payload, std::string(payload, 'p') + "/pong");
  ASSERT_EQ(response->storages.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(storage_matches(response->storages[i], sizes[i],
                                static_cast<uint8_t>(i)))
        << "storage " << i << " of " << sizes[i] << " bytes";
  }
}

TEST(LibfabricBackend, UnknownProviderIsNotViableNamingIt) {
  EXPECT_THAT(
      libfabric_backend({{"libfabric.provider", "carrier_pigeon"}}).viable(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("carrier_pigeon"), HasSubstr("tcp;ofi_rxm"))));
  EXPECT_THAT(
      ::tether::testing::create_status(
          libfabric_backend(), {{"libfabric.provider", "carrier_pigeon"}}),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("'carrier_pigeon' is not available")));
}

TEST(LibfabricBackend, ProvidersOfAGroupMustMatch) {
  if (!libfabric_backend({{"libfabric.provider", "shm"}}).viable().ok()) {
    GTEST_SKIP() << "shm is not available here";
  }
  // Rank 0 on tcp;ofi_rxm, rank 1 on shm: each refuses the other.
  Backend mixed = libfabric_backend();
  mixed.create = [create = mixed.create](AgentSetup setup) {
    setup.settings["libfabric.provider"] =
        setup.self.id == 0 ? "tcp;ofi_rxm" : "shm";
    return create(std::move(setup));
  };
  ::tether::testing::AgentGroup group(mixed, 2);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(
        group.error(rank),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 AllOf(HasSubstr("'shm'"), HasSubstr("'tcp;ofi_rxm'"))));
  }
}

// shm names its memory regions (files in /dev/shm) after the endpoint; a
// killed process leaves its file behind. Opening an shm endpoint removes
// those of tether's endpoints whose process is gone, and no others.
TEST(LibfabricBackend, ShmRemovesRegionsOfDeadProcesses) {
  if (!libfabric_backend({{"libfabric.provider", "shm"}}).viable().ok()) {
    GTEST_SKIP() << "shm is not available here";
  }
  char link[64] = {0};
  ASSERT_GT(::readlink("/proc/self/ns/pid", link, sizeof(link)), 0);
  std::string ns;
  for (const char* c = link; *c != '\0'; ++c) {
    if (*c >= '0' && *c <= '9') ns += *c;
  }
  pid_t dead = 0;
  for (pid_t pid = 4000000; pid > 1 && dead == 0; --pid) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) dead = pid;
  }
  ASSERT_NE(dead, 0);
  const std::string stale =
      absl::StrCat("/dev/shm/tether-lf-", ns, "-", dead, "-1:0:0");
  const std::string alive =
      absl::StrCat("/dev/shm/tether-lf-", ns, "-", ::getpid(), "-1:0:0");
  // Named after this process too: two runs of this test at once (bazel's
  // --runs_per_test) find the same dead pid, and each removes its own
  // foreign file at the end.
  const std::string foreign =
      absl::StrCat("/dev/shm/", dead, ":", ::getpid(), ":0");
  for (const std::string& path : {stale, alive, foreign}) {
    std::FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_NE(file, nullptr) << path;
    std::fclose(file);
  }
  Group group("shm", 1);
  ASSERT_TRUE(group.ok()) << group.error(0);
  EXPECT_NE(::access(stale.c_str(), F_OK), 0);
  EXPECT_EQ(::access(alive.c_str(), F_OK), 0);
  EXPECT_EQ(::access(foreign.c_str(), F_OK), 0);
  std::remove(alive.c_str());
  std::remove(foreign.c_str());
}

TEST_P(Provider, ReportsWhatItRunsOn) {
  Group group(GetParam(), 2);
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  LibfabricStats stats = stats_of(group[0]);
  EXPECT_EQ(stats.provider, GetParam());
  EXPECT_EQ(stats.rendezvous, "read");
  EXPECT_EQ(stats.credits, 16u);
  // shm's inject size (4 KiB) bounds its eager frames.
  const uint64_t threshold = GetParam() == "shm" ? 3072 : 16 << 10;
  EXPECT_EQ(stats.rendezvous_threshold, threshold);
  EXPECT_EQ(stats.eager_buffer_bytes, threshold + 1024);
}

// Paddle's WorkerInfo.ip/.port: tcp;ofi_rxm's endpoint name is the socket
// address the worker listens on; shm has none.
TEST_P(Provider, EndpointOfAWorkerIsItsSocketAddressOnTcp) {
  Group group(GetParam(), 2);
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  absl::StatusOr<std::optional<Endpoint>> mine =
      group[0].endpoint_of(group[0].self());
  absl::StatusOr<std::optional<Endpoint>> peer =
      group[0].endpoint_of(group[1].self());
  ASSERT_THAT(mine, IsOk());
  ASSERT_THAT(peer, IsOk());
  EXPECT_THAT(group[0].endpoint_of(WorkerInfo{"stranger", 7}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("stranger")));
  if (GetParam() == "shm") {
    EXPECT_FALSE(mine->has_value());
    EXPECT_FALSE(peer->has_value());
    return;
  }
  ASSERT_TRUE(mine->has_value());
  ASSERT_TRUE(peer->has_value());
  EXPECT_FALSE((*mine)->ip.empty());
  EXPECT_GT((*mine)->port, 0);
  EXPECT_GT((*peer)->port, 0);
  EXPECT_NE((*mine)->port, (*peer)->port);
  // Agent 1 sees the same endpoint of agent 0 as agent 0 does.
  absl::StatusOr<std::optional<Endpoint>> seen =
      group[1].endpoint_of(group[0].self());
  ASSERT_THAT(seen, IsOk());
  ASSERT_TRUE(seen->has_value());
  EXPECT_EQ((*seen)->ip, (*mine)->ip);
  EXPECT_EQ((*seen)->port, (*mine)->port);
}

// Payloads and storages below, at and above the rendezvous threshold, in
// several chunks, in each rendezvous mode.
TEST_P(Provider, RoundTripsOfEverySizeInEachRendezvousMode) {
  for (const char* mode : {"read", "tagged"}) {
    SCOPED_TRACE(mode);
    Group group(GetParam(), 2,
                {{"libfabric.rendezvous", mode},
                 {"libfabric.rendezvous_threshold", "16384"}});
    ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
    EXPECT_EQ(stats_of(group[0]).rendezvous, mode);
    group.start_all(echo);
    expect_round_trip(group, 0, {});
    expect_round_trip(group, 10, {0, 1, 100});
    expect_round_trip(group, 100, {(16 << 10) - 1, 16 << 10, (16 << 10) + 1});
    expect_round_trip(group, 20 << 10, {1 << 20, 3});
    expect_round_trip(group, 5, {(40 << 20) + 7});
    // The last three requests had parts of at least the threshold.
    EXPECT_EQ(stats_of(group[0]).rendezvous_sent, 3u);
  }
}

// Thousands of storages: their descriptors do not fit an eager buffer, so
// the body itself goes by rendezvous.
TEST_P(Provider, ManyStoragesSendTheirListByRendezvous) {
  for (const char* mode : {"read", "tagged"}) {
    Group group(GetParam(), 2, {{"libfabric.rendezvous", mode}});
    ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
    group.start_all(echo);
    std::vector<size_t> sizes(3000, 24);
    sizes[1000] = 100 << 10;
    expect_round_trip(group, 30, sizes);
  }
}

TEST_P(Provider, SmallThresholdSendsMostThingsByRendezvous) {
  Group group(GetParam(), 2, {{"libfabric.rendezvous_threshold", "256"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, 300, {255, 256, 4096});
  EXPECT_EQ(stats_of(group[0]).eager_buffer_bytes, 256u + 1024u);
}

// A fast sender and a receiver that does not answer: the sender never has
// more frames in flight than the receiver's credits plus its control slot,
// and everything arrives once the receiver answers.
TEST_P(Provider, CreditsBoundFramesInFlight) {
  Group group(GetParam(), 2, {{"libfabric.credits", "2"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  auto held = std::make_shared<HeldResponses>();
  ASSERT_THAT(group[0].start(echo), IsOk());
  ASSERT_THAT(group[1].start([held](Message request) {
    return held->hold(std::move(request));
  }),
              IsOk());
  constexpr int kCalls = 64;
  std::vector<Future<Message>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(
        group[0].send(group[1].self(), ping(absl::StrCat(i)), kBound));
  }
  held->wait_for(kCalls);
  held->release_all();
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<Message> response = calls[i].get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->payload, absl::StrCat(i, "/late"));
  }
  const LibfabricStats sender = stats_of(group[0]);
  EXPECT_EQ(sender.credits, 2u);
  EXPECT_LE(sender.max_frames_in_flight, 3u);
  EXPECT_GT(sender.credit_waits, 0u);
  EXPECT_LE(stats_of(group[1]).max_frames_in_flight, 3u);
}

// A round trip of `storage` through agent 1 (echo): it comes back intact.
void expect_echoed(Group& group, const c10::Storage& storage) {
  Message request = ping("s");
  request.storages.push_back(storage);
  absl::StatusOr<Message> response =
      group[0]
          .send(group[1].self(), std::move(request), kBound)
          .get(absl::Now() + kBound);
  ASSERT_THAT(response, IsOk());
  ASSERT_EQ(response->storages.size(), 1u);
  ASSERT_EQ(response->storages[0].nbytes(), storage.nbytes());
  EXPECT_EQ(std::memcmp(response->storages[0].data(), storage.data(),
                        storage.nbytes()),
            0);
}

TEST_P(Provider, RegistrationCacheServesRepeatedSends) {
  Group group(GetParam(), 2);
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  const c10::Storage storage = make_storage(1 << 20, 7);
  for (int i = 0; i < 5; ++i) expect_echoed(group, storage);
  const LibfabricStats stats = stats_of(group[0]);
  EXPECT_EQ(stats.mr_cache_misses, 1u);
  EXPECT_EQ(stats.mr_cache_hits, 4u);
}

TEST_P(Provider, RegistrationCacheEvictsBeyondItsBounds) {
  Group group(GetParam(), 2, {{"libfabric.mr_cache_entries", "2"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  std::vector<c10::Storage> held;
  for (int i = 0; i < 5; ++i) {
    held.push_back(make_storage(100 << 10, static_cast<uint8_t>(i)));
    expect_echoed(group, held.back());
  }
  const LibfabricStats stats = stats_of(group[0]);
  EXPECT_EQ(stats.mr_cache_misses, 5u);
  EXPECT_EQ(stats.mr_cache_evictions, 3u);
}

// Storages the application no longer holds are not kept for the cache.
TEST_P(Provider, RegistrationCacheLetsDroppedStoragesGo) {
  Group group(GetParam(), 2);
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  for (int i = 0; i < 5; ++i) {
    expect_echoed(group, make_storage(100 << 10, static_cast<uint8_t>(i)));
  }
  // The last one goes when another registration is released (or at the
  // agent's next housekeeping tick); one the test still holds stays.
  const c10::Storage kept = make_storage(100 << 10, 9);
  expect_echoed(group, kept);
  const LibfabricStats stats = stats_of(group[0]);
  EXPECT_EQ(stats.mr_cache_misses, 6u);
  EXPECT_EQ(stats.mr_cache_evictions, 5u);
}

// Keepalives, answered by the peer's progress thread, keep a peer whose
// handler holds a request alive well past libfabric.peer_timeout_ms. (A peer
// that dies silently is lost after it: the multi-process conformance suite
// kills one.)
TEST_P(Provider, PeerHoldingARequestStaysAlivePastThePeerTimeout) {
  Group group(GetParam(), 2, {{"libfabric.peer_timeout_ms", "500"}});
  ASSERT_TRUE(group.ok());
  auto holder = std::make_shared<HeldResponses>();
  group.start_all(
      [holder](Message request) { return holder->hold(std::move(request)); });
  Future<Message> pending =
      group[0].send(group[1].self(), ping("p"), absl::InfiniteDuration());
  holder->wait_for(1);
  // Alive but holding: keepalives keep it so, well past the timeout.
  EXPECT_THAT(pending.wait(absl::Now() + absl::Milliseconds(1500)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  holder->release_all();
  EXPECT_THAT(pending.get(absl::Now() + kBound), IsOk());
}

// A peer whose process died is lost at the next look (every 100 ms), also
// while it is a zombie its parent has not reaped yet (torchrun's agent
// reaps its workers every 5 s): the call to it fails UNAVAILABLE, not at
// the peer timeout. Rank 1 is a child of this process, which reaps it only
// at the end; it kills itself when the call arrives. (Before, its zombie
// passed kill(pid, 0) and the call waited out its 10 s.)
TEST_P(Provider, APeerThatDiedIsLostWhileItIsAZombie) {
  const std::string provider = GetParam();
  ::tether::testing::run_in_processes(1, [&provider](int, int) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      absl::StatusOr<RendezvousResult> member =
          ::tether::testing::meet_as_agent("env://", 1, 2);
      if (!member.ok()) ::_exit(2);
      absl::StatusOr<std::unique_ptr<Agent>> agent =
          ::tether::testing::create_agent(
              libfabric_backend(), *member,
              {{"libfabric.provider", provider}});
      if (!agent.ok()) ::_exit(3);
      const absl::Status started =
          (*agent)->start([](Message) -> Future<Message> {
            ::raise(SIGKILL);
            return Future<Message>();
          });
      if (!started.ok()) ::_exit(4);
      for (;;) ::pause();
    }
    struct Reaper {
      pid_t pid;
      int status = 0;
      ~Reaper() {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
    } reaper{child};
    absl::StatusOr<RendezvousResult> member =
        ::tether::testing::meet_as_agent("env://", 0, 2);
    ASSERT_THAT(member, IsOk());
    absl::StatusOr<std::unique_ptr<Agent>> agent =
        ::tether::testing::create_agent(libfabric_backend(), *member,
                                        {{"libfabric.provider", provider}});
    ASSERT_THAT(agent, IsOk());
    ASSERT_THAT((*agent)->start(echo), IsOk());
    const absl::Time sent = absl::Now();
    absl::StatusOr<Message> response =
        (*agent)
            ->send(member->workers[1], ping("die"), absl::Seconds(10))
            .get(absl::Now() + kBound);
    const absl::Duration took = absl::Now() - sent;
    EXPECT_THAT(response, StatusIs(absl::StatusCode::kUnavailable,
                                   HasSubstr("(rank 1) is lost")));
    EXPECT_LT(took, absl::Seconds(5));
    (*agent)->shutdown();
  });
}

// Silence is counted by our own clock, so a process that was itself away
// (stopped, or starved of CPU) longer than the peer timeout must not take a
// peer that answered all along for lost when it resumes: the peer is asked
// again first. Rank 1's handler holds rank 0's request 400 ms, stops rank 0
// for 4x the timeout, resumes it, and answers 300 ms later.
TEST(LibfabricBackend, OwnStallIsNotTakenForALostPeer) {
  ::tether::testing::run_in_processes(2, [](int rank, int world) {
    absl::StatusOr<RendezvousResult> member =
        ::tether::testing::meet_as_agent("env://", rank, world);
    ASSERT_THAT(member, IsOk());
    absl::StatusOr<std::unique_ptr<Agent>> agent =
        ::tether::testing::create_agent(libfabric_backend(), *member,
                                        {{"libfabric.provider", "tcp;ofi_rxm"},
                                         {"libfabric.peer_timeout_ms", "500"}});
    ASSERT_THAT(agent, IsOk());
    c10d::Store& store = *member->store;
    if (rank == 0) {
      const std::string pid = absl::StrCat(::getpid());
      store.set("test/pid0", std::vector<uint8_t>(pid.begin(), pid.end()));
      ASSERT_THAT((*agent)->start(echo), IsOk());
      absl::StatusOr<Message> response =
          (*agent)
              ->send(member->workers[1], ping("stop me"), kBound)
              .get(absl::Now() + kBound);
      EXPECT_THAT(response, IsOk());
      store.set("test/done", {1});
      store.wait({"test/left"}, std::chrono::seconds(30));
      (*agent)->shutdown();
      return;
    }
    const std::vector<uint8_t> bytes = store.get("test/pid0");
    const pid_t pid = std::stoi(std::string(bytes.begin(), bytes.end()));
    // The handler returns at once (it runs on the progress thread, which
    // must stay free to answer keepalives); a thread of its own stops rank 0
    // and answers later.
    std::thread stopper;
    ASSERT_THAT((*agent)->start([pid, &stopper](Message request) {
      Promise<Message> answer;
      stopper = std::thread([pid, answer, request]() mutable {
        // Rank 0 waits on us a while (keepalives, answered), then stops.
        absl::SleepFor(absl::Milliseconds(400));
        ::kill(pid, SIGSTOP);
        absl::SleepFor(absl::Seconds(2));
        ::kill(pid, SIGCONT);
        absl::SleepFor(absl::Milliseconds(300));
        answer.set(echo(std::move(request)).get(absl::Now() + kBound));
      });
      return answer.future();
    }),
                IsOk());
    store.wait({"test/done"}, std::chrono::seconds(60));
    stopper.join();
    (*agent)->shutdown();
    store.set("test/left", {1});
  });
}

// The backend on `provider` whose agents all have `limits`.
Backend limited_backend(const std::string& provider, MessageLimits limits) {
  Backend backend = libfabric_backend({{"libfabric.provider", provider}});
  backend.create = [create = backend.create, limits](AgentSetup setup) {
    setup.limits = limits;
    return create(std::move(setup));
  };
  return backend;
}

absl::StatusOr<Message> send_sized(Agent& from, Agent& to, size_t payload,
                                   const std::vector<size_t>& sizes) {
  Message request = ping(std::string(payload, 'p'));
  for (size_t size : sizes) request.storages.push_back(make_storage(size, 1));
  return from.send(to.self(), std::move(request), kBound)
      .get(absl::Now() + kBound);
}

// 4 KiB of payload, 4 storages, 1 MiB of storage bytes.
constexpr MessageLimits kSmallLimits = [] {
  MessageLimits limits;
  limits.max_payload_bytes = 4096;
  limits.max_storages = 4;
  limits.max_storage_bytes = 1 << 20;
  return limits;
}();

// Two agents with kSmallLimits on `provider`, moving bodies over 16 KiB by
// rendezvous `mode`.
class SmallLimitsGroup : public AgentGroup {
 public:
  SmallLimitsGroup(const std::string& provider, const char* mode)
      : AgentGroup(limited_backend(provider, kSmallLimits), 2,
                   {{"libfabric.rendezvous", mode},
                    {"libfabric.rendezvous_threshold", "16384"}}) {}
};

// Frames announcing more than the receiver's MessageLimits are refused
// before it allocates or pulls anything: the sender's call fails with
// RESOURCE_EXHAUSTED naming the limit, and the receiver serves on.
TEST_P(Provider, MessagesOverTheLimitsAreRefusedBeforeAllocating) {
  for (const char* mode : {"read", "tagged"}) {
    SCOPED_TRACE(mode);
    SmallLimitsGroup group(GetParam(), mode);
    ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
    group.start_all(echo);
    // Inline payload, too many storages, storage bytes by rendezvous.
    EXPECT_THAT(
        send_sized(group[0], group[1], 5000, {}),
        StatusIs(absl::StatusCode::kResourceExhausted,
                 AllOf(HasSubstr("max_payload_bytes"), HasSubstr("agent1"))));
    EXPECT_THAT(send_sized(group[0], group[1], 1, {1, 1, 1, 1, 1}),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("max_storages")));
    EXPECT_THAT(send_sized(group[0], group[1], 1, {(1 << 20) + 1}),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("max_storage_bytes")));
    EXPECT_THAT(send_sized(group[0], group[1], 1, {600 << 10, 600 << 10}),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("max_storage_bytes")));
    // Nothing was pulled for them.
    EXPECT_EQ(stats_of(group[1]).bytes_pulled, 0u);
    // Within the limits: served.
    EXPECT_THAT(send_sized(group[0], group[1], 4000, {1 << 20}), IsOk());
    EXPECT_THAT(send_sized(group[0], group[1], 1, {1, 1, 1, 1}), IsOk());
  }
}

// A response over the caller's limits (the handler's answer is its own
// business) is refused by the caller before it allocates or pulls: the call
// fails with RESOURCE_EXHAUSTED naming the limit, and both agents go on.
TEST_P(Provider, ResponsesOverTheCallersLimitsFailTheCall) {
  for (const char* mode : {"read", "tagged"}) {
    SCOPED_TRACE(mode);
    SmallLimitsGroup group(GetParam(), mode);
    ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
    group.start_all([](Message request) -> Future<Message> {
      Message response;
      response.type = MessageType::kPong;
      if (request.payload == "payload") {
        response.payload = std::string(5000, 'r');
      } else if (request.payload == "storages") {
        for (int i = 0; i < 5; ++i) {
          response.storages.push_back(make_storage(1, 1));
        }
      } else if (request.payload == "bytes") {
        response.storages.push_back(make_storage((1 << 20) + 1, 1));
      } else {
        return echo(std::move(request));
      }
      return Future<Message>::ready(std::move(response));
    });
    for (const auto& [ask, limit] :
         std::vector<std::pair<std::string, std::string>>{
             {"payload", "max_payload_bytes"},
             {"storages", "max_storages"},
             {"bytes", "max_storage_bytes"}}) {
      SCOPED_TRACE(ask);
      EXPECT_THAT(group[0]
                      .send(group[1].self(), ping(ask), kBound)
                      .get(absl::Now() + kBound),
                  StatusIs(absl::StatusCode::kResourceExhausted,
                           AllOf(HasSubstr(limit), HasSubstr("agent1"))));
    }
    EXPECT_EQ(stats_of(group[0]).bytes_pulled, 0u);
    EXPECT_THAT(send_sized(group[0], group[1], 10, {1 << 20}), IsOk());
    EXPECT_THAT(send_sized(group[1], group[0], 10, {10}), IsOk());
  }
}

// A descriptor list too long for an eager buffer (its body by rendezvous)
// that no message within the limits could need is refused before the body
// is allocated or pulled.
TEST_P(Provider, RemoteBodiesOverTheLimitsAreRefusedBeforePulling) {
  MessageLimits limits;
  limits.max_payload_bytes = 1024;
  limits.max_storages = 4;
  limits.max_storage_bytes = 1024;
  ::tether::testing::AgentGroup group(limited_backend(GetParam(), limits), 2);
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  EXPECT_THAT(send_sized(group[0], group[1], 1, std::vector<size_t>(3000, 1)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("over what the limits allow")));
  EXPECT_EQ(stats_of(group[1]).bytes_pulled, 0u);
  EXPECT_THAT(send_sized(group[0], group[1], 10, {10}), IsOk());
}

}  // namespace
}  // namespace tether::testing
