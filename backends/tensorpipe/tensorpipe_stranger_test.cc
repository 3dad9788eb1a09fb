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
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/common/fd_assist.h"
#include "backends/tensorpipe/internal/tcp_handshake.h"
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "core/agent.h"
#include "testing/agent_testing.h"
#include "testing/multiprocess.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::tether::backends::tensorpipe_backend;

// A listening socket of another process, as /proc shows it.
struct Listening {
  int family = AF_INET;  // AF_INET, AF_INET6 or AF_UNIX
  std::string address;   // numeric IP, or the unix path ('@' = abstract)
  int port = 0;

  std::string describe() const {
    if (family == AF_UNIX) return absl::StrCat("unix:", address);
    return absl::StrCat(family == AF_INET6 ? "[" : "", address,
                        family == AF_INET6 ? "]" : "", ":", port);
  }
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The inodes of `pid`'s sockets.
std::set<uint64_t> socket_inodes(pid_t pid) {
  std::set<uint64_t> inodes;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* fds = ::opendir(dir.c_str());
  if (fds == nullptr) return inodes;
  while (dirent* entry = ::readdir(fds)) {
    char target[128];
    const std::string link = absl::StrCat(dir, "/", entry->d_name);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    absl::string_view text(target, static_cast<size_t>(n));
    uint64_t inode = 0;
    if (absl::ConsumePrefix(&text, "socket:[") &&
        absl::ConsumeSuffix(&text, "]") && absl::SimpleAtoi(text, &inode)) {
      inodes.insert(inode);
    }
  }
  ::closedir(fds);
  return inodes;
}

// "0100007F:1F90" (tcp) or 32 hex digits and a port (tcp6).
bool parse_proc_address(absl::string_view text, int family, Listening* out) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() != 2) return false;
  uint32_t port = 0;
  if (!absl::SimpleHexAtoi(parts[1], &port)) return false;
  uint32_t words[4] = {};
  const size_t count = family == AF_INET ? 1 : 4;
  if (parts[0].size() != 8 * count) return false;
  for (size_t i = 0; i < count; ++i) {
    if (!absl::SimpleHexAtoi(parts[0].substr(8 * i, 8), &words[i])) {
      return false;
    }
  }
  char buffer[INET6_ADDRSTRLEN] = {};
  // /proc prints each 32-bit word in host order.
  if (::inet_ntop(family, words, buffer, sizeof(buffer)) == nullptr) {
    return false;
  }
  out->family = family;
  out->address = buffer;
  out->port = static_cast<int>(port);
  if (out->address == "0.0.0.0") out->address = "127.0.0.1";
  if (out->address == "::") out->address = "::1";
  return true;
}

// The fields of each line of `file` (a /proc/net table) with at least
// `min_fields` fields that is a listening socket (field `state_field` is
// `listening`) of `inodes` (its inode is field `inode_field`).
std::vector<std::vector<std::string>> listening_lines(
    const char* file, size_t min_fields, size_t state_field,
    absl::string_view listening, size_t inode_field,
    const std::set<uint64_t>& inodes) {
  std::vector<std::vector<std::string>> found;
  for (const std::string& line : lines_of(file)) {
    std::vector<std::string> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t inode = 0;
    if (fields.size() >= min_fields && fields[state_field] == listening &&
        absl::SimpleAtoi(fields[inode_field], &inode) &&
        inodes.count(inode) != 0) {
      found.push_back(std::move(fields));
    }
  }
  return found;
}

// Every socket `pid` listens on.
std::vector<Listening> listening_sockets(pid_t pid) {
  const std::set<uint64_t> inodes = socket_inodes(pid);
  std::vector<Listening> found;
  for (const auto& [file, family] :
       {std::pair<const char*, int>{"/proc/net/tcp", AF_INET},
        {"/proc/net/tcp6", AF_INET6}}) {
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode; st 0A is
    // LISTEN.
    for (const std::vector<std::string>& fields :
         listening_lines(file, 10, 3, "0A", 9, inodes)) {
      Listening listening;
      if (parse_proc_address(fields[1], family, &listening)) {
        found.push_back(listening);
      }
    }
  }
  // Num RefCount Protocol Flags Type St Inode Path; listening: Flags has
  // __SO_ACCEPTCON (00010000).
  for (const std::vector<std::string>& fields :
       listening_lines("/proc/net/unix", 8, 3, "00010000", 6, inodes)) {
    Listening listening;
    listening.family = AF_UNIX;
    listening.address = fields[7];
    found.push_back(listening);
  }
  return found;
}

// This process's open files, by descriptor: what each one is (a socket's
// or pipe's inode, a file's path), the directory stream's own left out.
std::map<int, std::string> open_file_list() {
  std::map<int, std::string> files;
  DIR* fds = ::opendir("/proc/self/fd");
  const int own = ::dirfd(fds);
  while (dirent* entry = ::readdir(fds)) {
    int fd = -1;
    if (entry->d_name[0] == '.' || !absl::SimpleAtoi(entry->d_name, &fd) ||
        fd == own) {
      continue;
    }
    char target[256] = {0};
    const std::string link = absl::StrCat("/proc/self/fd/", fd);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    files[fd] = n > 0 ? std::string(target, n) : "?";
  }
  ::closedir(fds);
  return files;
}

int open_files() { return static_cast<int>(open_file_list().size()); }

// The descriptors of `after` that are not in `before` as they were.
std::string new_files(const std::map<int, std::string>& before,
                      const std::map<int, std::string>& after) {
  std::string out;
  for (const auto& [fd, what] : after) {
    auto it = before.find(fd);
    if (it == before.end() || it->second != what) {
      absl::StrAppend(&out, " ", fd, " -> ", what, ";");
    }
  }
  return out.empty() ? " none" : out;
}

// A connected socket to `to`, or -1 (errno set).
int connect_to(const Listening& to) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (to.family == AF_UNIX) {
    auto* un = reinterpret_cast<sockaddr_un*>(&storage);
    un->sun_family = AF_UNIX;
    std::string path = to.address;
    const bool abstract = !path.empty() && path[0] == '@';
    if (abstract) path[0] = '\0';
    std::memcpy(un->sun_path, path.data(), path.size());
    length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) +
                                    path.size() + (abstract ? 0 : 1));
  } else if (to.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(to.port));
    ::inet_pton(AF_INET, to.address.c_str(), &in->sin_addr);
    length = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(to.port));
    ::inet_pton(AF_INET6, to.address.c_str(), &in6->sin6_addr);
    length = sizeof(sockaddr_in6);
  }
  const int fd = ::socket(to.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

// Sends `bytes` on a fresh connection to `to` and waits (up to `bound`) for
// the worker to close it. True if it did.
bool send_and_expect_close(const Listening& to, const std::string& bytes,
                           absl::Duration bound) {
  const int fd = connect_to(to);
  if (fd < 0) {
    ADD_FAILURE() << "cannot connect to " << to.describe() << ": "
                  << std::strerror(errno);
    return false;
  }
  // The worker may close as soon as it has seen enough: a short write or
  // EPIPE is fine (MSG_NOSIGNAL: this process must not die of it either).
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  timeval timeout{};
  timeout.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(bound));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  bool closed = false;
  char sink[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n > 0) continue;  // whatever the worker says before closing
    closed = n == 0 || errno == ECONNRESET;
    break;
  }
  ::close(fd);
  return closed;
}

// The attacks above, on one port.
void attack(const Listening& to) {
  SCOPED_TRACE(to.describe());
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
    const int fd = connect_to(to);
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
          before = open_file_list();
          baseline = static_cast<int>(before.size());
          assists_before = backends::common::assist_descriptors();
          set_key(store, "test/pid", absl::StrCat(::getpid()));
        }
        Caller caller(**agent, peer);
        if (rank == 0) {
          pid_t pid = 0;
          ASSERT_TRUE(absl::SimpleAtoi(get_key(store, "test/pid"), &pid));
          const std::vector<Listening> ports = listening_sockets(pid);
          for (const Listening& port : ports) {
            std::cerr << "attacking " << port.describe() << "\n";
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
          int now = open_files();
          while (now != expected() && absl::Now() < deadline) {
            absl::SleepFor(absl::Milliseconds(20));
            now = open_files();
          }
          EXPECT_EQ(now, expected())
              << "open files before the attack: " << baseline
              << ", after: " << now << ", of which assists' eventfds "
              << backends::common::assist_descriptors() - assists_before
              << " more than before; new or changed:"
              << new_files(before, open_file_list());
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
using backends::tensorpipe::internal::HandshakeFrame;
using backends::tensorpipe::internal::HandshakeKind;
using backends::tensorpipe::internal::parse_handshake_frame;

// Where agent `rank` of `group` listens with tether's tcp transport.
Listening tcp_listener(AgentGroup& group, int rank) {
  const std::string text =
      get_key(group.store(), absl::StrCat("tether/tensorpipe/", rank));
  Listening listening;
  const size_t start = text.find("tcp=127.0.0.1:");
  EXPECT_NE(start, std::string::npos) << text;
  if (start == std::string::npos) return listening;
  listening.address = "127.0.0.1";
  listening.port = std::stoi(text.substr(start + 14));
  return listening;
}

// The next handshake frame on `fd` (bounded wait), or an error.
absl::StatusOr<HandshakeFrame> read_frame(int fd) {
  timeval timeout{};
  timeout.tv_sec = 30;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string bytes;
  for (;;) {
    auto parsed = parse_handshake_frame(bytes);
    if (!parsed.ok()) return parsed.status();
    if (parsed->has_value()) return (*parsed)->frame;
    char c;
    if (::recv(fd, &c, 1, 0) != 1) {
      return absl::UnavailableError("closed before a whole frame");
    }
    bytes.push_back(c);
  }
}

void send_frame(int fd, const HandshakeFrame& frame) {
  const std::string bytes = encode_handshake_frame(frame);
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// A Hello (the first frame of the handshake) as worker `name`.
void send_hello(int fd, const std::string& name) {
  HandshakeFrame hello;
  hello.name = name;
  send_frame(fd, hello);
}

// True once the worker closes `fd` (bounded wait).
bool closed_by_worker(int fd) {
  timeval timeout{};
  timeout.tv_sec = 30;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char sink[256];
  for (;;) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n > 0) continue;
    return n == 0 || errno == ECONNRESET;
  }
}

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
  const int fd = connect_to(tcp_listener(group, 1));
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
  const int fd = connect_to(tcp_listener(group, 1));
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
// that are no TensorPipe message, each close that one connection. (An error
// on a connection before its first message fails TensorPipe's whole
// listener, and the agent listens again on the same address: hence a group
// per case.)
TEST(TensorPipeStrangers, BadFramesAfterTheHandshakeCloseThatConnection) {
  for (const bool huge : {true, false}) {
    SCOPED_TRACE(huge ? "huge length" : "not a TensorPipe message");
    AgentGroup group(tensorpipe_backend(), 2);
    ASSERT_TRUE(group.ok());
    group.start_all(echo);
    const int fd = connect_to(tcp_listener(group, 1));
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
    std::string bytes(8, '\0');
    const uint64_t length = huge ? uint64_t{1} << 40 : 24;
    std::memcpy(bytes.data(), &length, sizeof(length));
    if (!huge) bytes += std::string(24, '\xee');
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(closed_by_worker(fd));
    ::close(fd);
    expect_serves(group);
  }
}

}  // namespace
}  // namespace tether::testing
