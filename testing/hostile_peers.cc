#include "testing/hostile_peers.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/time/clock.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "core/auth/auth.h"
#include "core/rendezvous.h"
#include "testing/agent_testing.h"
#include "testing/multiprocess.h"
#include "testing/process_resources.h"
#include "testing/raw_sockets.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

// How long a whole test may run before its processes are killed.
constexpr absl::Duration kDeadline = absl::Seconds(120);
// Each call alongside the attack: a worker whose loop a stranger blocks
// fails them.
constexpr absl::Duration kCallBound = absl::Seconds(10);
// How long the worker's descriptors and memory are given to come back once
// the stranger has gone.
constexpr absl::Duration kSettleBound = absl::Seconds(15);
// Growth of malloc's bytes in use that is not a leak (caches, arenas of the
// threads that served the calls).
constexpr int64_t kMemorySlackKb = 8 << 10;
// How long a connect to the worker may take (its accept queue may be full
// while it works through a thousand).
constexpr absl::Duration kConnectBound = absl::Seconds(5);

constexpr int kWorld = 3;
constexpr int kVictim = 1;
constexpr char kSecret[] = "hostile-peers-group-secret-0123456789";

constexpr char kTargetsKey[] = "hostile/targets";
constexpr char kPidKey[] = "hostile/pid";
constexpr char kAttackedKey[] = "hostile/attacked";
constexpr char kMeasuredKey[] = "hostile/measured";
constexpr char kDoneKey[] = "hostile/done";

std::string warm_key(int rank) { return absl::StrCat("hostile/warm/", rank); }
std::string stopped_key(int rank) {
  return absl::StrCat("hostile/stopped/", rank);
}

std::string left_key(int rank) { return absl::StrCat("hostile/left/", rank); }

// TETHER_HOSTILE_SCALE: how many times the default connection counts.
int scale() {
  int value = 1;
  const char* text = std::getenv("TETHER_HOSTILE_SCALE");
  if (text == nullptr || !absl::SimpleAtoi(text, &value) || value < 1) {
    return 1;
  }
  return value;
}

// ------------------------------------------------------------------ store

void set_key(c10d::Store& store, const std::string& key,
             const std::string& value = "1") {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string get_key(c10d::Store& store, const std::string& key) {
  std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

// Waits until `key` is set, up to `timeout`; a test failure if it is not.
bool wait_key(c10d::Store& store, const std::string& key,
              absl::Duration timeout) {
  try {
    store.wait({key},
               std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "waiting for '" << key << "' in the store: " << e.what();
    return false;
  }
}

std::string encode_targets(const std::vector<ListeningAddress>& targets) {
  std::vector<std::string> lines;
  for (const ListeningAddress& t : targets) {
    lines.push_back(absl::StrCat(t.host, " ", t.port, " ", t.ipv6 ? 6 : 4));
  }
  return absl::StrJoin(lines, "\n");
}

std::vector<ListeningAddress> decode_targets(const std::string& text) {
  std::vector<ListeningAddress> targets;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ');
    ListeningAddress t;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[1], &t.port)) continue;
    t.host = fields[0];
    t.ipv6 = fields[2] == "6";
    targets.push_back(t);
  }
  return targets;
}

// ------------------------------------------------------------ raw clients

// One connection per entry of `sends` to `target`, each sent its bytes and
// then held (half-closed when `half_close`): each must be ended by the
// worker within kRefuseBound. Closes them all.
void expect_refused(const ListeningAddress& target,
                    const std::vector<HostileBytes>& sends, bool half_close) {
  std::vector<int> fds;
  std::vector<std::string> names;
  for (const HostileBytes& send : sends) {
    const int fd = connect_to(target, kConnectBound);
    if (fd < 0) {
      ADD_FAILURE() << "cannot connect to " << target.to_string() << " for "
                    << send.name;
      continue;
    }
    // A worker that closes at once may refuse the rest of the bytes.
    send_all(fd, send.bytes, kRefuseBound);
    if (half_close) ::shutdown(fd, SHUT_WR);
    fds.push_back(fd);
    names.push_back(send.name);
  }
  const absl::Time start = absl::Now();
  const std::vector<bool> ended = ended_within(fds, kRefuseBound);
  const absl::Duration took = absl::Now() - start;
  int refused = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    EXPECT_TRUE(ended[i]) << target.to_string() << " did not end, within "
                          << absl::FormatDuration(kRefuseBound)
                          << ", a connection that sent " << names[i]
                          << (half_close ? " and closed its side" : "");
    refused += ended[i] ? 1 : 0;
    ::close(fds[i]);
  }
  std::printf("%s: %d of %zu connections ended by the worker (%s)\n",
              target.to_string().c_str(), refused, fds.size(),
              absl::FormatDuration(took).c_str());
}

// Each frame through the dialect's transport: the worker must end each
// stream within kRefuseBound, with `code` if given.
void expect_frames_refused(const HostileDialect& dialect,
                           const ListeningAddress& target,
                           const std::vector<HostileBytes>& frames,
                           std::optional<absl::StatusCode> code) {
  for (const HostileBytes& frame : frames) {
    const absl::Time start = absl::Now();
    const absl::Status status =
        dialect.deliver(target.to_string(), frame.bytes, kRefuseBound);
    std::printf("%s: a stream that sent %s ended after %s: %s\n",
                target.to_string().c_str(), frame.name.c_str(),
                absl::FormatDuration(absl::Now() - start).c_str(),
                status.ToString().c_str());
    EXPECT_NE(status.code(), absl::StatusCode::kDeadlineExceeded)
        << target.to_string() << " did not end, within "
        << absl::FormatDuration(kRefuseBound) << ", a stream that sent "
        << frame.name << ": " << status;
    EXPECT_FALSE(status.ok()) << frame.name << " was accepted";
    if (code.has_value()) {
      EXPECT_EQ(status.code(), *code) << frame.name << ": " << status;
    }
  }
}

std::string random_bytes(size_t size, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random() & 0xff);
  return bytes;
}

std::string le64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

std::string be32(uint32_t value) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<char>(value >> (8 * (3 - i)));
  }
  return out;
}

// Length prefixes as any protocol might read them, huge or negative.
std::vector<HostileBytes> generic_lengths() {
  return {
      {"8 bytes 0xff (2^64 - 1, or -1)", std::string(8, '\xff')},
      {"2^62 as a little-endian u64", le64(uint64_t{1} << 62)},
      {"-2^63 as a little-endian i64", le64(uint64_t{1} << 63)},
      {"2^31 - 1 as a big-endian u32 and more",
       be32(0x7fffffff) + std::string(28, '\x01')},
      {"-2^31 as a big-endian i32 and more",
       be32(0x80000000) + std::string(28, '\x02')},
  };
}

// What a backend's openings and the generic prefixes give for a case.
std::vector<HostileBytes> openings(const HostileDialect& dialect) {
  std::vector<HostileBytes> all = generic_lengths();
  all.insert(all.end(), dialect.openings.begin(), dialect.openings.end());
  return all;
}

std::vector<HostileBytes> first_halves(const std::vector<HostileBytes>& all) {
  std::vector<HostileBytes> halves;
  for (const HostileBytes& b : all) {
    if (b.bytes.size() < 2) continue;
    halves.push_back({absl::StrCat("the first half of ", b.name),
                      b.bytes.substr(0, b.bytes.size() / 2)});
  }
  return halves;
}

// ------------------------------------------------------------------ calls

// Real calls from `from` to `to`, one after another, each with a fresh
// payload and a storage, until stop(). Thread-compatible: stop() then read.
class Streamer {
 public:
  Streamer(Agent& from, WorkerInfo to)
      : from_(from), to_(std::move(to)), thread_([this] { run(); }) {}
  ~Streamer() { stop(); }

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  // After stop(): every call succeeded, and there were some.
  void expect_all_succeeded(const std::string& who) const {
    EXPECT_GT(calls_, 0) << who << " made no call";
    EXPECT_EQ(failures_, 0) << who << ": " << failures_ << " of " << calls_
                            << " calls failed; the first: " << first_error_;
    std::printf("%s: %lld calls alongside, all answered; slowest %s\n",
                who.c_str(), static_cast<long long>(calls_),
                absl::FormatDuration(slowest_).c_str());
  }

 private:
  void run() {
    // At least one call, even when stop() comes at once (a fast attack on a
    // loaded machine).
    for (int64_t i = 0; i == 0 || !stop_.load(); ++i) {
      const uint8_t seed = static_cast<uint8_t>(i);
      const size_t size = 4096 + static_cast<size_t>(i % 7);
      Message request = ping(absl::StrCat("stream/", i));
      request.storages.push_back(make_storage(size, seed));
      const absl::Time start = absl::Now();
      absl::StatusOr<Message> response =
          from_.send(to_, std::move(request), kCallBound)
              .get(start + kCallBound + absl::Seconds(5));
      slowest_ = std::max(slowest_, absl::Now() - start);
      ++calls_;
      absl::Status failed;
      if (!response.ok()) {
        failed = response.status();
      } else if (response->payload != absl::StrCat("stream/", i, "/pong") ||
                 response->storages.size() != 1 ||
                 !storage_matches(response->storages[0], size, seed)) {
        failed = absl::DataLossError("a wrong response");
      }
      if (!failed.ok() && failures_++ == 0) first_error_ = failed.ToString();
    }
  }

  Agent& from_;
  const WorkerInfo to_;
  std::atomic<bool> stop_{false};
  int64_t calls_ = 0;
  int64_t failures_ = 0;
  std::string first_error_;
  absl::Duration slowest_;
  std::thread thread_;
};

// ------------------------------------------------------------------ group

// What rank 0 runs against the worker under attack: its listening
// addresses, its pid (for /proc), the backend's dialect.
struct Victim {
  std::vector<ListeningAddress> targets;
  pid_t pid = -1;
};
using Attack = std::function<void(const Victim&, const HostileDialect&)>;

// The descriptors of process `pid` (-1 if unreadable).
int fd_count_of(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    return n;
  }
  return -1;
}

// The worker under attack: its baseline, and the check once the stranger
// has gone.
class Baseline {
 public:
  Baseline()
      : fds_(open_fd_count()),
        malloc_kb_(malloc_in_use_kb()),
        rss_kb_(rss_anon_kb()) {
    std::printf("baseline: %d descriptors, malloc %lld kB, RssAnon %lld kB\n",
                fds_, static_cast<long long>(malloc_kb_),
                static_cast<long long>(rss_kb_));
  }

  void expect_back() const {
    const absl::Time start = absl::Now();
    // Nothing to wait on but the kernel's table: look until it is back or
    // the bound passes.
    int fds = open_fd_count();
    while (fds > fds_ && absl::Now() - start < kSettleBound) {
      absl::SleepFor(absl::Milliseconds(20));
      fds = open_fd_count();
    }
    const int64_t malloc_kb = malloc_in_use_kb();
    std::printf(
        "after: %d descriptors (baseline %d) %s after the stranger left, "
        "malloc %lld kB (%+lld), RssAnon %lld kB (%+lld)\n",
        fds, fds_, absl::FormatDuration(absl::Now() - start).c_str(),
        static_cast<long long>(malloc_kb),
        static_cast<long long>(malloc_kb - malloc_kb_),
        static_cast<long long>(rss_anon_kb()),
        static_cast<long long>(rss_anon_kb() - rss_kb_));
    EXPECT_LE(fds, fds_) << "descriptors the stranger left behind (after "
                         << absl::FormatDuration(kSettleBound)
                         << "); open now:\n"
                         << describe_open_fds();
    EXPECT_LE(malloc_kb, malloc_kb_ + kMemorySlackKb)
        << "memory the stranger left behind";
  }

 private:
  const int fds_;
  const int64_t malloc_kb_;
  const int64_t rss_kb_;
};

void run_case(const HostileParam& param, bool authenticated,
              const Attack& attack) {
  run_in_processes(
      kWorld,
      [&param, authenticated, &attack](int rank, int world) {
        absl::StatusOr<RendezvousResult> member =
            meet_as_agent("env://", rank, world);
        ASSERT_THAT(member, IsOk());
        c10d::Store& store = *member->store;
        AgentSetup setup;
        setup.self = member->self;
        setup.workers = member->workers;
        setup.store = member->store;
        setup.group_key = member->group_key;
        if (authenticated) {
          absl::StatusOr<std::optional<auth::Authenticator>> secret =
              auth::Authenticator::from(kSecret);
          ASSERT_THAT(secret, IsOk());
          setup.auth = **secret;
        }
        absl::StatusOr<std::unique_ptr<Agent>> made =
            param.backend().create(std::move(setup));
        ASSERT_THAT(made, IsOk());
        Agent& agent = **made;
        ASSERT_THAT(agent.start(echo), IsOk());
        const std::vector<WorkerInfo>& workers = member->workers;

        // Every pair the test uses talks once, so that the group's own
        // connections are in the baseline.
        auto warm = [&agent](const WorkerInfo& to) {
          EXPECT_THAT(
              agent.send(to, ping("warm"), kBound).get(absl::Now() + kBound),
              IsOk())
              << "warming up the connection to " << to.name;
        };
        if (rank == kVictim) {
          warm(workers[0]);
          warm(workers[2]);
        } else {
          warm(workers[kVictim]);
        }
        set_key(store, warm_key(rank));

        std::optional<Baseline> baseline;
        if (rank == kVictim) {
          if (!wait_key(store, warm_key(0), kDeadline)) return;
          if (!wait_key(store, warm_key(2), kDeadline)) return;
          baseline.emplace();
          // The rendezvous store's port is not the backend's (rank 0
          // serves it anyway).
          const char* store_port = std::getenv("MASTER_PORT");
          std::vector<ListeningAddress> targets;
          for (const ListeningAddress& t : listening_tcp_addresses()) {
            if (store_port == nullptr || absl::StrCat(t.port) != store_port) {
              targets.push_back(t);
            }
          }
          std::printf("listening on %zu TCP address(es): %s\n", targets.size(),
                      encode_targets(targets).c_str());
          set_key(store, kPidKey, absl::StrCat(::getpid()));
          set_key(store, kTargetsKey, encode_targets(targets));
        }

        {
          Streamer streamer(agent, workers[rank == kVictim ? 2 : kVictim]);
          if (rank == 0) {
            if (!wait_key(store, kTargetsKey, kDeadline)) return;
            Victim victim;
            victim.targets = decode_targets(get_key(store, kTargetsKey));
            EXPECT_FALSE(victim.targets.empty())
                << "the worker under attack listens on no TCP address";
            int pid = -1;
            if (absl::SimpleAtoi(get_key(store, kPidKey), &pid)) {
              victim.pid = pid;
            }
            attack(victim, param.dialect());
            set_key(store, kAttackedKey);
          } else {
            wait_key(store, kAttackedKey, kDeadline);
          }
          streamer.stop();
          streamer.expect_all_succeeded(
              absl::StrCat("agent", rank, " -> ", rank == kVictim ? 2 : 1));
        }
        // No worker may leave while another still calls it: a store's wait
        // may see a key some milliseconds after another worker did.
        set_key(store, stopped_key(rank));

        if (rank == kVictim) {
          baseline->expect_back();
          set_key(store, kMeasuredKey);
        }
        if (rank == 0) {
          wait_key(store, kMeasuredKey, kDeadline);
          wait_key(store, stopped_key(1), kDeadline);
          wait_key(store, stopped_key(2), kDeadline);
          absl::StatusOr<Message> alive =
              agent.send(workers[kVictim], ping("alive"), kBound)
                  .get(absl::Now() + kBound);
          ASSERT_THAT(alive, IsOk()) << "the worker under attack after it";
          EXPECT_EQ(alive->payload, "alive/pong");
          // Rank 0 serves the store: it leaves last.
          set_key(store, kDoneKey);
          wait_key(store, left_key(1), kBound);
          wait_key(store, left_key(2), kBound);
          agent.shutdown();
          return;
        }
        wait_key(store, kDoneKey, kDeadline);
        agent.shutdown();
        set_key(store, left_key(rank));
      },
      kDeadline);
}

}  // namespace

void HostilePeers::SetUp() {
  const absl::Status viable = GetParam().backend().viable();
  if (!viable.ok()) {
    GTEST_SKIP() << GetParam().label << " is not viable here: " << viable;
  }
}

TEST_P(HostilePeers, RandomBytesAreRefused) {
  run_case(GetParam(), false, [](const Victim& v, const HostileDialect& d) {
    for (const ListeningAddress& target : v.targets) {
      std::vector<HostileBytes> sends;
      for (int i = 0; i < 16 * scale(); ++i) {
        sends.push_back({absl::StrCat("64 KiB of random bytes (seed ", i, ")"),
                         random_bytes(64 << 10, i)});
      }
      expect_refused(target, sends, /*half_close=*/false);
      if (d.deliver) {
        std::vector<HostileBytes> frames;
        for (int i = 0; i < 3; ++i) {
          frames.push_back(
              {absl::StrCat("a frame of random bytes (seed ", i, ")"),
               random_bytes(1000 + 1000 * i, 100 + i)});
        }
        expect_frames_refused(d, target, frames, std::nullopt);
      }
    }
  });
}

TEST_P(HostilePeers, HugeAndNegativeLengthsAreRefused) {
  run_case(GetParam(), false, [](const Victim& v, const HostileDialect& d) {
    for (const ListeningAddress& target : v.targets) {
      expect_refused(target, openings(d), /*half_close=*/false);
      if (d.deliver) expect_frames_refused(d, target, d.frames, std::nullopt);
    }
  });
}

TEST_P(HostilePeers, TruncatedFramesAreRefused) {
  run_case(GetParam(), false, [](const Victim& v, const HostileDialect& d) {
    for (const ListeningAddress& target : v.targets) {
      std::vector<HostileBytes> halves = first_halves(openings(d));
      halves.push_back({"one byte", "\x01"});
      expect_refused(target, halves, /*half_close=*/true);
      if (d.deliver) {
        expect_frames_refused(d, target, first_halves(d.frames), std::nullopt);
      }
    }
  });
}

TEST_P(HostilePeers, IdleConnectionsCostNothingOnceClosed) {
  run_case(GetParam(), false, [](const Victim& v, const HostileDialect&) {
    if (v.targets.empty()) return;
    const int count = 1000 * scale();
    const int before = fd_count_of(v.pid);
    std::vector<int> fds;
    for (int i = 0; i < count; ++i) {
      const int fd = connect_to(v.targets[i % v.targets.size()], kConnectBound);
      if (fd >= 0) fds.push_back(fd);
    }
    // Until the worker has taken them (its descriptors grow by as many),
    // or a while: a worker that leaves them in its accept queue is fine.
    const absl::Time start = absl::Now();
    int peak = fd_count_of(v.pid);
    while (peak < before + static_cast<int>(fds.size()) &&
           absl::Now() - start < kRefuseBound) {
      absl::SleepFor(absl::Milliseconds(20));
      peak = std::max(peak, fd_count_of(v.pid));
    }
    std::printf(
        "%zu of %d idle connections made; the worker's descriptors went from "
        "%d to %d\n",
        fds.size(), count, before, peak);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (i % 2 == 0) {
        ::close(fds[i]);
      } else {
        reset(fds[i]);
      }
    }
  });
}

TEST_P(HostilePeers, SlowSendersHoldUpNothing) {
  run_case(GetParam(), false, [](const Victim& v, const HostileDialect& d) {
    // A byte at a time, for about two seconds, of what a real client would
    // open with (the backend's first opening) or of random bytes.
    const std::string bytes = d.openings.empty()
                                  ? random_bytes(100, 7)
                                  : d.openings.front().bytes.substr(0, 100);
    std::vector<int> fds;
    for (const ListeningAddress& target : v.targets) {
      for (int i = 0; i < 4 * scale(); ++i) {
        const int fd = connect_to(target, kConnectBound);
        if (fd >= 0) fds.push_back(fd);
      }
    }
    for (int tick = 0; tick < 100; ++tick) {
      for (int fd : fds) {
        const char byte = bytes[tick % bytes.size()];
        ::send(fd, &byte, 1, MSG_NOSIGNAL);
      }
      // The pace of the attack, not a wait for anything.
      absl::SleepFor(absl::Milliseconds(20));
    }
    for (int fd : fds) ::close(fd);
  });
}

TEST_P(HostilePeers, ConnectCloseCyclesLeaveNothing) {
  run_case(GetParam(), false, [](const Victim& v, const HostileDialect&) {
    if (v.targets.empty()) return;
    const int before = fd_count_of(v.pid);
    int made = 0;
    for (int i = 0; i < 300 * scale(); ++i) {
      const int fd = connect_to(v.targets[i % v.targets.size()], kConnectBound);
      if (fd < 0) continue;
      ++made;
      if (i % 2 == 0) {
        ::close(fd);
      } else {
        reset(fd);
      }
    }
    std::printf(
        "%d connect/close cycles; the worker's descriptors: %d, now %d\n", made,
        before, fd_count_of(v.pid));
  });
}

TEST_P(HostilePeers, FramesBeforeAuthenticationAreRefused) {
  run_case(GetParam(), true, [](const Victim& v, const HostileDialect& d) {
    for (const ListeningAddress& target : v.targets) {
      expect_refused(target, openings(d), /*half_close=*/false);
      if (d.deliver) {
        expect_frames_refused(d, target, d.frames, std::nullopt);
        expect_frames_refused(d, target, {{"a well-formed request", d.request}},
                              d.refused_before_authentication);
      }
    }
  });
}

}  // namespace tether::testing
