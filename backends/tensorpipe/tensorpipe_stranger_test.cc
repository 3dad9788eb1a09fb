// Strangers on a tensorpipe worker's ports (docs/security.md): a plain
// socket that reaches any port a worker listens on (the TCP listener, the
// mpt channel's lanes, any unix socket) sends 16 bytes of 0xff, a huge length
// prefix, random bytes, and connects and closes 300 times, while the group
// streams real calls. The worker must survive, every real call must
// succeed, each stranger's connection must be closed by the worker, and the
// worker's file descriptors must come back to what they were.
//
// The listening ports are found the way an attacker on the host would: the
// worker's socket inodes in /proc/<pid>/fd, matched against /proc/net/tcp,
// tcp6 and unix.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/common/fd_assist.h"
#include "backends/tensorpipe/internal/framing.h"
#include "backends/tensorpipe/internal/tcp_handshake.h"
#include "backends/tensorpipe/internal/tcp_transport.h"
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "core/agent.h"
#include "testing/agent_testing.h"
#include "testing/multiprocess.h"
#include "testing/process_resources.h"
#include "testing/raw_sockets.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::tether::backends::tensorpipe_backend;

// How long the worker may take to answer or end a stranger's connection.
constexpr absl::Duration kWorkerBound = absl::Seconds(30);

// Bytes no worker accepts, then 300 connect/close cycles, on one port.
void attack(const ListeningAddress& to) {
  SCOPED_TRACE(to.to_string());
  const absl::Duration bound = absl::Seconds(30);
  EXPECT_TRUE(send_and_expect_close(to, std::string(16, '\xff'), bound))
      << "16 bytes of 0xff";
  std::string huge(16, '\0');
  const uint64_t length = uint64_t{1} << 62;
  std::memcpy(huge.data(), &length, sizeof(length));
  EXPECT_TRUE(send_and_expect_close(to, huge, bound)) << "a huge length";
  std::mt19937 random(16);
  for (int round = 0; round < 4; ++round) {
    std::string noise(4096, '\0');
    for (char& c : noise) c = static_cast<char>(random());
    EXPECT_TRUE(send_and_expect_close(to, noise, bound)) << "random bytes";
  }
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_to(to, bound);
    if (fd < 0) {
      ADD_FAILURE() << "connection " << i << ": " << std::strerror(errno);
      return;
    }
    ::close(fd);
  }
}

// Calls `to` with small and 256 KiB requests until `stop`; counts them and
// records every failure.
class Caller {
 public:
  Caller(Agent& agent, WorkerInfo to) : agent_(agent), to_(std::move(to)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Caller() { finish(); }

  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int calls() const { return calls_; }

 private:
  void run() {
    for (int i = 0; !stop_; ++i) {
      Message request = ping(absl::StrCat("call ", i));
      const bool big = i % 8 == 0;
      if (big) request.storages.push_back(make_storage(256 << 10, i % 251));
      absl::StatusOr<Message> response =
          agent_.send(to_, std::move(request), kBound)
              .get(absl::Now() + kBound);
      ASSERT_THAT(response, IsOk()) << "call " << i << " to " << to_.name;
      EXPECT_EQ(response->payload, absl::StrCat("call ", i, "/pong"));
      if (big) {
        ASSERT_EQ(response->storages.size(), 1u);
        EXPECT_TRUE(storage_matches(response->storages[0], 256 << 10, i % 251));
      }
      ++calls_;
    }
  }

  Agent& agent_;
  const WorkerInfo to_;
  std::atomic<bool> stop_{false};
  std::atomic<int> calls_{0};
  std::thread thread_;
};

void set_key(c10d::Store& store, const std::string& key,
             const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string get_key(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

void wait_key(c10d::Store& store, const std::string& key) {
  store.wait({key}, std::chrono::seconds(120));
}

// Rank 1 is the worker under attack, rank 0 the stranger's host: it attacks
// from a plain socket of its own, not through its agent. Both stream calls
// to each other meanwhile.
TEST(TensorPipeStrangers, GarbageOnEveryPortLeavesTheWorkerServing) {
  ::tether::testing::run_in_processes(
      2,
      [](int rank, int world) {
        absl::StatusOr<RendezvousResult> member =
            ::tether::testing::meet_as_agent("env://", rank, world);
        ASSERT_THAT(member, IsOk());
        // The default configuration (what a user gets) with the opt-in mpt
        // channel added, so that its lanes' ports are attacked too. To see
        // TensorPipe's own transports fall over (docs/security.md), run
        // with TETHER_STRANGER_TRANSPORTS=uv or =shm.
        ::tether::testing::AgentSettings settings;
        settings["tensorpipe.channels"] = "basic,cma_write,mpt";
        if (const char* transports =
                std::getenv("TETHER_STRANGER_TRANSPORTS")) {
          settings["tensorpipe.transports"] = transports;
        }
        absl::StatusOr<std::unique_ptr<Agent>> agent =
            ::tether::testing::create_agent(tensorpipe_backend(), *member,
                                            settings);
        ASSERT_THAT(agent, IsOk());
        ASSERT_THAT((*agent)->start(echo), IsOk());
        c10d::Store& store = *member->store;
        const WorkerInfo& peer = member->workers[1 - rank];
        // Both ways, small and large, so that every pipe, transport and
        // channel the default configuration uses is set up first.
        for (size_t bytes : {size_t{64}, size_t{4} << 20}) {
          Message request = ping("warm");
          request.storages.push_back(make_storage(bytes, 5));
          ASSERT_THAT((*agent)
                          ->send(peer, std::move(request), kBound)
                          .get(absl::Now() + kBound),
                      IsOk());
        }
        set_key(store, absl::StrCat("test/warm", rank), "1");
        wait_key(store, absl::StrCat("test/warm", 1 - rank));
        int baseline = 0;
        int assists_before = 0;
        std::map<int, std::string> before;
        if (rank == 1) {
          before = open_fds();
          baseline = static_cast<int>(before.size());
          assists_before = backends::common::assist_descriptors();
          set_key(store, "test/pid", absl::StrCat(::getpid()));
        }
        Caller caller(**agent, peer);
        if (rank == 0) {
          pid_t pid = 0;
          ASSERT_TRUE(absl::SimpleAtoi(get_key(store, "test/pid"), &pid));
          const std::vector<ListeningAddress> ports = listening_sockets(pid);
          for (const ListeningAddress& port : ports) {
            std::cerr << "attacking " << port.to_string() << "\n";
            attack(port);
          }
          EXPECT_FALSE(ports.empty()) << "found no port of worker 1";
          set_key(store, "test/attacked", "1");
        } else {
          wait_key(store, "test/attacked");
        }
        caller.finish();
        EXPECT_GT(caller.calls(), 0);
        std::cerr << "rank " << rank << " made " << caller.calls()
                  << " calls during the attack\n";
        // The worker still serves, both ways.
        Message after = ping("after");
        after.storages.push_back(make_storage(1 << 20, 9));
        EXPECT_THAT((*agent)
                        ->send(peer, std::move(after), kBound)
                        .get(absl::Now() + kBound),
                    IsOk());
        if (rank == 1) {
          // Every stranger's socket is closed: the count comes back. The
          // worker closes them on its own threads; wait for that, bounded.
          // A thread that waited with the assist for the first time since
          // (this one, if its sends ran on the backend's thread before)
          // holds an eventfd of its own meanwhile: counted apart.
          const absl::Time deadline = absl::Now() + absl::Seconds(30);
          auto expected = [&] {
            return baseline + backends::common::assist_descriptors() -
                   assists_before;
          };
          int now = open_fd_count();
          while (now != expected() && absl::Now() < deadline) {
            absl::SleepFor(absl::Milliseconds(20));
            now = open_fd_count();
          }
          EXPECT_EQ(now, expected())
              << "open files before the attack: " << baseline
              << ", after: " << now << ", of which assists' eventfds "
              << backends::common::assist_descriptors() - assists_before
              << " more than before; new or changed:"
              << changed_fds(before, open_fds());
        }
        set_key(store, absl::StrCat("test/done", rank), "1");
        wait_key(store, absl::StrCat("test/done", 1 - rank));
        // Rank 0's process serves the store: it leaves last, once rank 1
        // has had its answer (else rank 1's wait may reach a closed store).
        if (rank == 1) set_key(store, "test/left", "1");
        if (rank == 0) wait_key(store, "test/left");
        (*agent)->shutdown();
      },
      absl::Seconds(240));
}

// ---------------------------------------------------- one process, by hand

using backends::tensorpipe::internal::encode_handshake_frame;
using backends::tensorpipe::internal::kExpressBit;
using backends::tensorpipe::internal::make_request_frame;
using backends::tensorpipe::internal::HandshakeFrame;
using backends::tensorpipe::internal::HandshakeKind;
using backends::tensorpipe::internal::parse_handshake_frame;

// Where agent `rank` of `group` listens with tether's tcp transport.
ListeningAddress tcp_listener(AgentGroup& group, int rank) {
  const std::string text =
      get_key(group.store(), absl::StrCat("tether/tensorpipe/", rank));
  ListeningAddress listening;
  const size_t start = text.find("tcp=127.0.0.1:");
  EXPECT_NE(start, std::string::npos) << text;
  if (start == std::string::npos) return listening;
  listening.host = "127.0.0.1";
  listening.port = std::stoi(text.substr(start + 14));
  return listening;
}

// The next handshake frame on `fd` (bounded wait), or an error.
absl::StatusOr<HandshakeFrame> read_frame(int fd) {
  std::string bytes;
  for (;;) {
    auto parsed = parse_handshake_frame(bytes);
    if (!parsed.ok()) return parsed.status();
    if (parsed->has_value()) return (*parsed)->frame;
    // A byte at a time: nothing past the frame is taken.
    absl::StatusOr<std::string> more = receive_some(fd, kWorkerBound, 1);
    if (!more.ok()) return more.status();
    bytes += *more;
  }
}

void send_frame(int fd, const HandshakeFrame& frame) {
  ASSERT_TRUE(send_all(fd, encode_handshake_frame(frame), kWorkerBound));
}

// A Hello (the first frame of the handshake) as worker `name`.
void send_hello(int fd, const std::string& name) {
  HandshakeFrame hello;
  hello.name = name;
  send_frame(fd, hello);
}

// True once the worker closes `fd` (bounded wait).
bool closed_by_worker(int fd) { return ended_within({fd}, kWorkerBound)[0]; }

void expect_serves(AgentGroup& group) {
  auto call = [&group] {
    Message request = ping("still");
    request.storages.push_back(make_storage(1 << 20, 4));
    return group[0]
        .send(group[1].self(), std::move(request), kBound)
        .get(absl::Now() + kBound);
  };
  // A connection refused while the agent listens again (see below) is
  // UNAVAILABLE; the next one gets through.
  const absl::Time deadline = absl::Now() + kBound;
  absl::StatusOr<Message> response = call();
  while (!response.ok() &&
         response.status().code() == absl::StatusCode::kUnavailable &&
         absl::Now() < deadline) {
    response = call();
  }
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload, "still/pong");
}

TEST(TensorPipeStrangers, SilentConnectionIsClosedAfterTheHandshakeTimeout) {
  AgentGroup group(tensorpipe_backend(), 2,
                   {{"tensorpipe.handshake_timeout_ms", "300"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  const int fd = connect_to(tcp_listener(group, 1), kWorkerBound);
  ASSERT_GE(fd, 0);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(closed_by_worker(fd));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  ::close(fd);
  expect_serves(group);
}

TEST(TensorPipeStrangers, NonMemberIsRefusedWithTheReason) {
  AgentGroup group(tensorpipe_backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  const int fd = connect_to(tcp_listener(group, 1), kWorkerBound);
  ASSERT_GE(fd, 0);
  send_hello(fd, "intruder");
  absl::StatusOr<HandshakeFrame> verdict = read_frame(fd);
  ASSERT_THAT(verdict, IsOk());
  EXPECT_EQ(verdict->kind, HandshakeKind::kVerdict);
  EXPECT_FALSE(verdict->accepted);
  EXPECT_THAT(verdict->reason,
              ::testing::HasSubstr("'intruder' is not a worker of this group"));
  EXPECT_TRUE(closed_by_worker(fd));
  ::close(fd);
  expect_serves(group);
}

// Past the handshake (a member's name, no secret in this group), what
// reaches TensorPipe is still bounded: a length over the limit, and bytes
// that are no TensorPipe message, each close that one connection; so do an
// express frame over its limit, one that is no tether frame, and a request
// as an express frame on a connection bound to no pipe. (An error on a
// connection before its first message fails TensorPipe's whole listener,
// and the agent listens again on the same address: hence a group per
// case.)
TEST(TensorPipeStrangers, BadFramesAfterTheHandshakeCloseThatConnection) {
  enum class Bad { kHuge, kGarbage, kExpressHuge, kExpressGarbage, kUnbound };
  for (const Bad bad : {Bad::kHuge, Bad::kGarbage, Bad::kExpressHuge,
                        Bad::kExpressGarbage, Bad::kUnbound}) {
    SCOPED_TRACE(static_cast<int>(bad));
    AgentGroup group(tensorpipe_backend(), 2);
    ASSERT_TRUE(group.ok());
    group.start_all(echo);
    const int fd = connect_to(tcp_listener(group, 1), kWorkerBound);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    send_hello(fd, "agent0");
    absl::StatusOr<HandshakeFrame> server_hello = read_frame(fd);
    ASSERT_THAT(server_hello, IsOk());
    ASSERT_EQ(server_hello->kind, HandshakeKind::kHello);
    HandshakeFrame proof;
    proof.kind = HandshakeKind::kProof;
    send_frame(fd, proof);
    absl::StatusOr<HandshakeFrame> verdict = read_frame(fd);
    ASSERT_THAT(verdict, IsOk());
    ASSERT_TRUE(verdict->accepted) << verdict->reason;
    std::string body;
    uint64_t length = 0;
    switch (bad) {
      case Bad::kHuge:
        length = uint64_t{1} << 40;
        break;
      case Bad::kGarbage:
        body = std::string(24, '\xee');
        break;
      case Bad::kExpressHuge:
        length = kExpressBit | (uint64_t{1} << 20);
        break;
      case Bad::kExpressGarbage:
        body = std::string(24, '\xee');
        length = kExpressBit;
        break;
      case Bad::kUnbound:
        body = make_request_frame(ping("unbound"))->to_tensorpipe().metadata;
        length = kExpressBit;
        break;
    }
    if ((length & ~kExpressBit) == 0) length |= body.size();
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &length, sizeof(length));
    send_all(fd, bytes + body, kWorkerBound);
    EXPECT_TRUE(closed_by_worker(fd));
    ::close(fd);
    expect_serves(group);
  }
}

}  // namespace
}  // namespace tether::testing
