// What is specific to the tensorpipe backend: transports and channels, the
// addresses it publishes, a listener that loses a connection. The Agent
// contract, creation and settings are checked by the conformance suite
// (tensorpipe_agent_test.cc, tensorpipe_creation_test.cc).
#include <absl/strings/match.h>
#include <absl/strings/str_split.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <tensorpipe/channel/cma/factory.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/error.h>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/tensorpipe/internal/tcp_transport.h"
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "core/agent.h"
#include "core/future.h"
#include "testing/agent_testing.h"
#include "testing/process_resources.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;
using ::tether::backends::tensorpipe_backend;

// A round trip with a payload and storages of several sizes.
void expect_round_trip(AgentGroup& group, size_t big) {
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

// The same, from two agents made with `settings`.
void expect_round_trip_with(AgentGroup::Settings settings, size_t big) {
  AgentGroup group(tensorpipe_backend(), 2, std::move(settings));
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_round_trip(group, big);
}

TEST(TensorPipeBackend, UvAndBasicOnlyStillRoundTrip) {
  expect_round_trip_with(
      {{"tensorpipe.transports", "uv"}, {"tensorpipe.channels", "basic"}},
      1 << 20);
}

// The default transport is tether's guarded tcp; 8 MiB exercises reads
// straight into the destination.
TEST(TensorPipeBackend, TcpAndBasicOnlyRoundTrip) {
  expect_round_trip_with(
      {{"tensorpipe.transports", "tcp"}, {"tensorpipe.channels", "basic"}},
      8 << 20);
}

// The lanes are tether's tcp transport whatever carries the pipes.
TEST(TensorPipeBackend, MptLanesRoundTrip) {
  expect_round_trip_with({{"tensorpipe.transports", "uv"},
                          {"tensorpipe.channels", "mpt"},
                          {"tensorpipe.mpt_lanes", "3"}},
                         8 << 20);
}

TEST(TensorPipeBackend, ShmAndCmaOnlyRoundTrip) {
  expect_round_trip_with(
      {{"tensorpipe.transports", "shm"}, {"tensorpipe.channels", "cma"}},
      4 << 20);
}

// The sender writes into the receiver's buffer: sizes from just over the
// payload limit (LibTorch's allocator would have served it) to 8 MiB.
TEST(TensorPipeBackend, CmaWriteChannelRoundTrips) {
  AgentGroup group(tensorpipe_backend(), 2,
                   {{"tensorpipe.transports", "tcp"},
                    {"tensorpipe.channels", "cma_write"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  for (size_t big : {size_t{(256 << 10) + 1}, size_t{3} << 20, size_t{8} << 20}) {
    SCOPED_TRACE(big);
    expect_round_trip(group, big);
  }
}

// Agent::link_to says what TensorPipe's negotiation picks: the highest
// priority channel both offer with equal descriptors. Within one process
// that is xth when offered, else cma_write (where the kernel lets a process
// write into another's memory), and basic when it is all there is.
TEST(TensorPipeBackend, EachPeersLinkIsWhatNegotiationPicks) {
  struct Case {
    std::string channels;
    std::string expected;
  };
  const bool cma = ::tensorpipe::channel::cma::create()->isViable();
  for (const Case& c : std::vector<Case>{
           {"basic", "basic"},
           {"basic, cma_write", cma ? "cma_write" : "basic"},
           {"basic, cma_write, xth", "xth"}}) {
    SCOPED_TRACE(c.channels);
    AgentGroup group(tensorpipe_backend(), 2,
                     {{"tensorpipe.channels", c.channels}});
    ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
    for (int rank : {0, 1}) {
      absl::StatusOr<PeerLink> link =
          group[rank].link_to(group[1 - rank].self());
      ASSERT_THAT(link, IsOk());
      EXPECT_EQ(link->transport, "tcp");
      EXPECT_EQ(link->channel, c.expected);
    }
    EXPECT_THAT(group[0].link_to(WorkerInfo{"nobody", 7}),
                StatusIs(absl::StatusCode::kNotFound));
  }
}

TEST(TensorPipeBackend, XthChannelRoundTripsWithinOneProcess) {
  expect_round_trip_with({{"tensorpipe.channels", "xth, basic"}}, 1 << 20);
}

// By default only the guarded tcp transport listens; that its
// address is published is checked by the creation area
// (tensorpipe_creation_test.cc).
TEST(TensorPipeBackend, OnlyTheGuardedTcpTransportListensByDefault) {
  AgentGroup group(tensorpipe_backend(), 2, {});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  std::vector<uint8_t> bytes = group.store().get("tether/tensorpipe/1");
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_THAT(text, HasSubstr("tcp=127.0.0.1:"));
  EXPECT_THAT(text, Not(HasSubstr("uv=")));
  EXPECT_THAT(text, Not(HasSubstr("shm=")));
}

TEST(TensorPipeBackend, TensorPipesOwnTransportsOnRequest) {
  AgentGroup group(tensorpipe_backend(), 2,
                   {{"tensorpipe.transports", "tcp,uv,shm"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  std::vector<uint8_t> bytes = group.store().get("tether/tensorpipe/1");
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_THAT(text, HasSubstr("tcp=127.0.0.1:"));
  EXPECT_THAT(text, HasSubstr("uv=127.0.0.1:"));
  EXPECT_THAT(text, HasSubstr("shm="));
  expect_round_trip(group, 1 << 20);
}

// This process's established TCP sockets.
int established_tcp_sockets() {
  int count = 0;
  for (absl::string_view line :
       absl::StrSplit(describe_open_fds(), '\n', absl::SkipEmpty())) {
    if (absl::StrContains(line, " tcp ESTABLISHED ")) ++count;
  }
  return count;
}

void expect_ping(AgentGroup& group, int from, int to) {
  ASSERT_THAT(group[from]
                  .send(group[to].self(), ping("p"), kBound)
                  .get(absl::Now() + kBound),
              IsOk());
}

// On tether's tcp transport the thread that sent a request and waits for
// its answer reads and handles that answer itself (the assist,
// tcp_transport_connection.h): the future completes on the waiting thread,
// inside its wait, not on the transport's poller. The peer answers after a
// few milliseconds, so that the answer comes while the caller waits; under
// load the caller may still start its wait late and find the poller has
// taken the answer, so the test asks for some calls, not all. Without the
// assist none completes on the waiting thread.
TEST(TensorPipeBackend, TheWaitingThreadHandlesItsOwnAnswer) {
  AgentGroup group(tensorpipe_backend(), 2,
                   {{"tensorpipe.transports", "tcp"},
                    {"tensorpipe.channels", "basic"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  absl::Mutex mu;
  std::vector<std::thread> answerers;
  group.start_all([&](Message request) {
    Promise<Message> answer;
    Future<Message> future = answer.future();
    absl::MutexLock lock(&mu);
    answerers.emplace_back(
        [answer, request = std::move(request)]() mutable {
          absl::SleepFor(absl::Milliseconds(3));
          echo(std::move(request)).on_complete(
              [answer](const absl::StatusOr<Message>& m) { answer.set(m); });
        });
    return future;
  });
  expect_ping(group, 0, 1);  // the pipe is open
  const std::thread::id self = std::this_thread::get_id();
  int on_waiter = 0;
  constexpr int kCalls = 20;
  for (int i = 0; i < kCalls; ++i) {
    Future<Message> answer =
        group[0].send(group[1].self(), ping("own"), kBound);
    std::atomic<bool> waiting{false};
    std::atomic<bool> here{false};
    answer.on_complete([&](const absl::StatusOr<Message>&) {
      here = waiting && std::this_thread::get_id() == self;
    });
    waiting = true;
    ASSERT_THAT(answer.get(absl::Now() + kBound), IsOk());
    waiting = false;
    if (here) ++on_waiter;
  }
  EXPECT_GT(on_waiter, 0);
  absl::MutexLock lock(&mu);
  for (std::thread& t : answerers) t.join();
}

// The waiting thread's voluntary context switches so far: each is a sleep.
int64_t sleeps_of_this_thread() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nvcsw;
}

// With RpcOptions::busy_poll the assisted wait polls the socket before it
// sleeps: an answer that comes within the poll finds the thread running, so
// a caller whose peer answers at once does not sleep for its answers. Without
// the poll it sleeps for most (44 to 50 of 50). The count is the kernel's, not a
// clock: a loaded machine preempts the thread (involuntary), it does not make
// it sleep. But under load the thread that answers, or the loop thread, can
// be preempted while it holds a lock the poller then waits for, which is a
// sleep (27 of 50 once in a full CI run): the best of three
// rounds is taken, so only a load that lasts all three fails it.
TEST(TensorPipeBackend, ABusyPollingWaiterDoesNotSleepForItsAnswers) {
  AgentGroup group(tensorpipe_backend(), 2,
                   {{"tensorpipe.transports", "tcp"},
                    {"tensorpipe.channels", "basic"}});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  expect_ping(group, 0, 1);  // the pipe is open
  constexpr int kCalls = 50;
  auto sleeps_for_calls = [&group] {
    const int64_t before = sleeps_of_this_thread();
    for (int i = 0; i < kCalls; ++i) {
      EXPECT_THAT(group[0]
                      .send(group[1].self(), ping("spin"), kBound)
                      .get(absl::Now() + kBound),
                  IsOk());
    }
    return sleeps_of_this_thread() - before;
  };
  const int64_t asleep = sleeps_for_calls();
  ::tether::internal::spin_waits_for(absl::Seconds(1));
  int64_t polling = sleeps_for_calls();
  for (int round = 1; round < 3 && polling >= kCalls / 5; ++round) {
    polling = std::min(polling, sleeps_for_calls());
  }
  ::tether::internal::wait_spin_ns.store(0);  // process-wide: the next tests sleep
  EXPECT_LT(polling, kCalls / 5)
      << "slept " << polling << " times polling, " << asleep << " without";
  EXPECT_GT(asleep, polling);
}

// A pair of workers shares one pipe: the second to send uses
// the pipe the first opened. One pipe on tcp + cma is 4 connections, both
// ends in this process: 8 sockets.
TEST(TensorPipeBackend, OnePipeCarriesBothWays) {
  AgentGroup group(tensorpipe_backend(), 2, {});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  const int before = established_tcp_sockets();
  expect_ping(group, 0, 1);
  const int one_way = established_tcp_sockets() - before;
  EXPECT_GT(one_way, 0);
  expect_ping(group, 1, 0);
  expect_ping(group, 0, 1);
  EXPECT_EQ(established_tcp_sockets() - before, one_way);
}

// Both open a pipe at once: the higher rank closes its own once its
// requests there are answered, and both directions go on over the other.
TEST(TensorPipeBackend, PipesOpenedAtOnceBecomeOne) {
  int one_pipe = 0;
  {
    // What one pipe holds, from a pair that sends one way only.
    AgentGroup single(tensorpipe_backend(), 2, {});
    ASSERT_TRUE(single.ok()) << single.error(0) << single.error(1);
    single.start_all(echo);
    const int before = established_tcp_sockets();
    expect_ping(single, 0, 1);
    one_pipe = established_tcp_sockets() - before;
  }
  ASSERT_GT(one_pipe, 0);
  AgentGroup group(tensorpipe_backend(), 2, {});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  const int before = established_tcp_sockets();
  Future<Message> up = group[0].send(group[1].self(), ping("up"), kBound);
  Future<Message> down = group[1].send(group[0].self(), ping("down"), kBound);
  ASSERT_THAT(up.get(absl::Now() + kBound), IsOk());
  ASSERT_THAT(down.get(absl::Now() + kBound), IsOk());
  // A retired pipe closes on tensorpipe's threads: wait for it, bounded,
  // while calls go both ways.
  const absl::Time deadline = absl::Now() + kBound;
  int pair = 0;
  do {
    expect_ping(group, 0, 1);
    expect_ping(group, 1, 0);
    pair = established_tcp_sockets() - before;
  } while (pair != one_pipe && absl::Now() < deadline);
  EXPECT_EQ(pair, one_pipe);
}

// A connection that never connects: what is asked of it waits until it is
// closed, and then fails.
class HeldConnection final : public ::tensorpipe::transport::Connection {
 public:
  void read(read_callback_fn fn) override { hold(wrap(std::move(fn))); }
  void read(void* /*ptr*/, size_t /*length*/, read_callback_fn fn) override {
    hold(wrap(std::move(fn)));
  }
  void write(const void* /*ptr*/, size_t /*length*/,
             write_callback_fn fn) override {
    hold(std::move(fn));
  }
  void read(::tensorpipe::AbstractNopHolder& /*object*/,
            read_nop_callback_fn fn) override {
    hold(std::move(fn));
  }
  void write(const ::tensorpipe::AbstractNopHolder& /*object*/,
             write_callback_fn fn) override {
    hold(std::move(fn));
  }
  void setId(std::string /*id*/) override {}
  void close() override {
    std::vector<std::function<void(const ::tensorpipe::Error&)>> held;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      held.swap(held_);
    }
    for (auto& fn : held) {
      fn(::tensorpipe::Error(
          std::make_shared<::tensorpipe::transport::ConnectionClosedError>(),
          __FILE__, __LINE__));
    }
  }

 private:
  static std::function<void(const ::tensorpipe::Error&)> wrap(
      read_callback_fn fn) {
    return [fn = std::move(fn)](const ::tensorpipe::Error& error) {
      fn(error, nullptr, 0);
    };
  }
  void hold(std::function<void(const ::tensorpipe::Error&)> fn) {
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        held_.push_back(std::move(fn));
        return;
      }
    }
    close();
    fn(::tensorpipe::Error(
        std::make_shared<::tensorpipe::transport::ConnectionClosedError>(),
        __FILE__, __LINE__));
  }

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void(const ::tensorpipe::Error&)>> held_
      ABSL_GUARDED_BY(mu_);
};

// A transport whose first connection is `real`'s and whose later ones are
// held: a pipe over it reaches its peer's listener, which accepts it, and
// then never opens, as when its process stalls or dies while connecting.
class FirstConnectionOnly final : public ::tensorpipe::transport::Context {
 public:
  explicit FirstConnectionOnly(
      std::shared_ptr<::tensorpipe::transport::Context> real)
      : real_(std::move(real)) {}
  std::shared_ptr<::tensorpipe::transport::Connection> connect(
      std::string addr) override {
    absl::MutexLock lock(&mu_);
    if (connects_++ == 0) return real_->connect(std::move(addr));
    auto held = std::make_shared<HeldConnection>();
    held_.push_back(held);
    return held;
  }
  std::shared_ptr<::tensorpipe::transport::Listener> listen(
      std::string addr) override {
    return real_->listen(std::move(addr));
  }
  bool isViable() const override { return real_->isViable(); }
  const std::string& domainDescriptor() const override {
    return real_->domainDescriptor();
  }
  bool canCommunicateWithRemote(
      const std::string& remote_domain_descriptor) const override {
    return real_->canCommunicateWithRemote(remote_domain_descriptor);
  }
  void setId(std::string id) override { real_->setId(std::move(id)); }
  void close() override {
    std::vector<std::shared_ptr<HeldConnection>> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (auto& connection : held) connection->close();
    real_->close();
  }
  void join() override { real_->join(); }
  // Waits up to `timeout` until `n` connections were asked for.
  bool wait_for_connects(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return connects_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  const std::shared_ptr<::tensorpipe::transport::Context> real_;
  absl::Mutex mu_;
  int connects_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<HeldConnection>> held_ ABSL_GUARDED_BY(mu_);
};

// A pipe a peer opened carries our requests only once a frame has come on
// it. Before, it may still be opening: TensorPipe's listener waits for the
// peer's channel connections and reads nothing on the pipe, so when the
// peer dies then, the pipe never fails, and a request put on it waited for
// its timeout (one run in ten of a worker killed just after its group
// formed). Here a stand-in for agent0 (a TensorPipe context on tether's
// tcp transport) opens a pipe to agent1 that never opens, and goes away;
// agent1's call to agent0 must be answered, by the real agent0.
TEST(TensorPipeBackend, ARequestDoesNotWaitOnAPeersPipeStillOpening) {
  AgentGroup group(tensorpipe_backend(), 2, {});
  ASSERT_TRUE(group.ok()) << group.error(0) << group.error(1);
  group.start_all(echo);
  std::vector<uint8_t> bytes = group.store().get("tether/tensorpipe/1");
  const std::string text(bytes.begin(), bytes.end());
  const size_t at = text.find("tcp=");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string address = text.substr(at + 4, text.find('\n', at) - at - 4);

  const std::string agent0 = group[0].self().name;
  const std::string agent1 = group[1].self().name;
  backends::tensorpipe::internal::TcpTransportOptions options;
  options.self = agent0;
  options.members = {agent0, agent1};
  auto transport = std::make_shared<FirstConnectionOnly>(
      backends::tensorpipe::internal::create_tcp_transport(options));
  auto stand_in = std::make_shared<::tensorpipe::Context>(
      ::tensorpipe::ContextOptions().name(agent0));
  stand_in->registerTransport(0, "tcp", transport);
  stand_in->registerChannel(0, "basic", ::tensorpipe::channel::basic::create());
  std::shared_ptr<::tensorpipe::Pipe> pipe = stand_in->connect(
      absl::StrCat("tcp://", address),
      ::tensorpipe::PipeOptions().remoteName(agent1));
  // agent1 accepted the pipe before it answered with the connections to
  // open, which are held.
  ASSERT_TRUE(transport->wait_for_connects(2, kBound));
  Future<Message> call =
      group[1].send(group[0].self(), ping("call"), absl::Seconds(10));
  pipe->close();
  stand_in->close();
  stand_in->join();
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> response = call.get(absl::Now() + kBound);
  EXPECT_THAT(response, IsOk());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// tensorpipe fails a listener when an accepted connection dies before its
// first packet (a peer crashing mid-connect); the agent listens again on the
// addresses its peers know.
// (TensorPipe's uv transport; tether's tcp never hands such a connection to
// tensorpipe.)
TEST(TensorPipeBackend, ListenerSurvivesAConnectionThatDiesEarly) {
  AgentGroup group(tensorpipe_backend(), 3, {{"tensorpipe.transports", "uv"}});
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
}  // namespace tether::testing
