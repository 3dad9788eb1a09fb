// fabric_pingpong: raw libfabric ping-pong and bandwidth between two
// processes, the fabric's own limit to compare the libfabric backend with
// (Debian ships no fabtests).
//
//   bazel build -c opt //tools:tether_run //tools:fabric_pingpong
//   bazel-bin/tools/tether_run --nproc 2 -- bazel-bin/tools/fabric_pingpong
//       --provider='tcp;ofi_rxm' --wait=fd  (one command line)
//   [--iterations=N] [--quick] [--max_bytes=N]  (as tools/bench.py passes)
//
// Both processes open one FI_EP_RDM endpoint as the backend does
// (backends/libfabric/internal/fabric.h) and exchange their names through
// a TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it). Then, with no
// tether code on the data path (only fi_tsend, fi_trecv, fi_read and
// fi_cq_read):
//   - ping-pong: rank 0 sends a tagged message of each size (8 B to 64 MiB,
//     up to --max_bytes), rank 1 sends it back; per-round-trip samples give
//     p50 and p99, and bytes both ways over the p50 an echo bandwidth
//     comparable with the bench's tensor echo;
//   - tagged bandwidth: rank 0 streams messages of each size, 16 in flight,
//     into receives rank 1 keeps posted; rank 1 acknowledges the last;
//   - read bandwidth: rank 1 pulls rank 0's registered buffer with fi_read
//     (where the provider has FI_RMA), as the backend's rendezvous does.
// --wait=poll spins on the completion queue; --wait=fd sleeps on its file
// descriptor between completions (as the backend's progress thread does
// where the provider offers one), which costs a wake-up per message.
// Prints a table and one JSON line (rank 0), with the "p50_us" (smallest
// size) and "sweep" rows tools/bench.py reads.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>
#include <poll.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "backends/libfabric/internal/fabric.h"
#include "tools/internal/launcher_env.h"
#include "tools/internal/pingpong.h"

namespace {

using tether::backends::libfabric::internal::Fabric;
using tether::backends::libfabric::internal::FabricOptions;
using tether::backends::libfabric::internal::fi_error_text;
using tether::backends::libfabric::internal::MemoryRegion;
using ::tether::bench::Clock;
using ::tether::bench::Latency;
using ::tether::bench::PingPongFlags;

constexpr uint64_t kTag = 7;
constexpr int kWindow = 16;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fabric_pingpong: %s\n", what.c_str());
  std::exit(1);
}

void check(ssize_t rc, const char* call) {
  if (rc != 0) {
    die(absl::StrCat(call, ": ", fi_error_text(static_cast<int>(-rc))));
  }
}

// One endpoint, its peer and how to wait for completions.
class Endpoint {
 public:
  Endpoint(std::unique_ptr<Fabric> fabric, bool sleep_on_fd)
      : fabric_(std::move(fabric)),
        sleep_on_fd_(sleep_on_fd && fabric_->wait_fd() >= 0) {}

  Fabric& fabric() { return *fabric_; }
  fi_addr_t peer = FI_ADDR_UNSPEC;
  bool sleeps() const { return sleep_on_fd_; }

  // Waits for `count` completions; dies on an error completion.
  void wait(int count) {
    fi_cq_tagged_entry entries[kWindow];
    while (count > 0) {
      const ssize_t n =
          fi_cq_read(fabric_->cq(), entries, std::min(count, kWindow));
      if (n > 0) {
        count -= static_cast<int>(n);
        continue;
      }
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry error{};
        fi_cq_readerr(fabric_->cq(), &error, 0);
        die(absl::StrCat("completion error: ", fi_error_text(error.err)));
      }
      if (n != -FI_EAGAIN) check(n, "fi_cq_read");
      if (sleep_on_fd_) {
        fid* fids[] = {&fabric_->cq()->fid};
        if (fi_trywait(fabric_->fabric(), fids, 1) == FI_SUCCESS) {
          pollfd wakeup{fabric_->wait_fd(), POLLIN, 0};
          ::poll(&wakeup, 1, 1000);
        }
      }
    }
  }

  // Posts an operation, progressing while the provider says FI_EAGAIN.
  template <typename F>
  void post(F op, const char* call) {
    for (;;) {
      const ssize_t rc = op();
      if (rc != -FI_EAGAIN) {
        check(rc, call);
        return;
      }
      fi_cq_tagged_entry entry;
      const ssize_t n = fi_cq_read(fabric_->cq(), &entry, 1);
      if (n > 0) ++early_;
      if (n == -FI_EAVAIL) die(absl::StrCat(call, ": completion error"));
    }
  }

  // Completions that arrived while posting (counted by the next wait()).
  int take_early() {
    const int early = early_;
    early_ = 0;
    return early;
  }

 private:
  std::unique_ptr<Fabric> fabric_;
  const bool sleep_on_fd_;
  int early_ = 0;
};

void send(Endpoint& ep, char* buffer, size_t size, void* desc) {
  ep.post(
      [&] {
        return fi_tsend(ep.fabric().ep(), buffer, size, desc, ep.peer, kTag,
                        nullptr);
      },
      "fi_tsend");
}

void receive(Endpoint& ep, char* buffer, size_t size, void* desc) {
  ep.post(
      [&] {
        return fi_trecv(ep.fabric().ep(), buffer, size, desc, FI_ADDR_UNSPEC,
                        kTag, 0, nullptr);
      },
      "fi_trecv");
}

// One round trip of `size` bytes: rank 0 sends, rank 1 sends it back.
void round_trip(Endpoint& ep, int rank, char* buffer, void* desc,
                size_t size) {
  if (rank == 0) {
    receive(ep, buffer, size, desc);
    send(ep, buffer, size, desc);
    ep.wait(2 - ep.take_early());
  } else {
    receive(ep, buffer, size, desc);
    ep.wait(1 - ep.take_early());
    send(ep, buffer, size, desc);
    ep.wait(1 - ep.take_early());
  }
}

// GB/s of `count` messages of `size` bytes, rank 0 to rank 1.
double tagged_bandwidth(Endpoint& ep, int rank, char* buffer, void* desc,
                        size_t size, int count) {
  char ack = 0;
  const auto start = Clock::now();
  if (rank == 0) {
    int in_flight = 0;
    for (int i = 0; i < count; ++i) {
      if (in_flight == kWindow) {
        ep.wait(1);
        --in_flight;
      }
      send(ep, buffer, size, desc);
      ++in_flight;
      in_flight -= ep.take_early();
    }
    receive(ep, &ack, 1, nullptr);
    ep.wait(in_flight + 1 - ep.take_early());
  } else {
    int posted = 0;
    int done = 0;
    while (done < count) {
      while (posted < count && posted - done < kWindow) {
        receive(ep, buffer, size, desc);
        ++posted;
      }
      ep.wait(1);
      done += 1 + ep.take_early();
    }
    send(ep, &ack, 1, nullptr);
    ep.wait(1 - ep.take_early());
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(size) * count / seconds / 1e9;
}

// GB/s of `count` reads of `size` bytes by rank 1 from rank 0's buffer.
double read_bandwidth(Endpoint& ep, int rank, c10d::Store& store, char* buffer,
                      const MemoryRegion& region, size_t size, int count) {
  char done = 0;
  if (rank == 0) {
    const std::string where =
        absl::StrCat(region.remote_address(buffer), " ", region.key());
    store.set(absl::StrCat("read/", size),
              std::vector<uint8_t>(where.begin(), where.end()));
    // The target progresses too (manual-progress providers serve reads in
    // fi_cq_read), until rank 1 says it is done.
    receive(ep, &done, 1, nullptr);
    ep.wait(1 - ep.take_early());
    return 0;
  }
  const std::vector<uint8_t> text = store.get(absl::StrCat("read/", size));
  uint64_t address = 0;
  uint64_t key = 0;
  std::sscanf(std::string(text.begin(), text.end()).c_str(), "%lu %lu",
              &address, &key);
  const auto start = Clock::now();
  int in_flight = 0;
  for (int i = 0; i < count; ++i) {
    if (in_flight == 4) {
      ep.wait(1);
      --in_flight;
    }
    ep.post(
        [&] {
          return fi_read(ep.fabric().ep(), buffer, size, region.desc(), ep.peer,
                         address, key, nullptr);
        },
        "fi_read");
    ++in_flight;
    in_flight -= ep.take_early();
  }
  ep.wait(in_flight);
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  send(ep, &done, 1, nullptr);
  ep.wait(1 - ep.take_early());
  return static_cast<double>(size) * count / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "tcp;ofi_rxm";
  std::string wait = "fd";
  PingPongFlags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--provider=", 0) == 0) {
      provider = arg.substr(11);
    } else if (arg.rfind("--wait=", 0) == 0 &&
               (arg.substr(7) == "fd" || arg.substr(7) == "poll")) {
      wait = arg.substr(7);
    } else if (!flags.parse(arg)) {
      std::fprintf(stderr,
                   "usage: fabric_pingpong [--provider=NAME] "
                   "[--wait=fd|poll] %s\n",
                   PingPongFlags::kUsage);
      return 2;
    }
  }
  const tether::LauncherEnv env = tether::bench::launched("fabric_pingpong");
  const int rank = env.rank;
  if (env.world_size != 2) die("run with --nproc 2");
  std::unique_ptr<c10d::TCPStore> store =
      tether::bench::launcher_store("fabric_pingpong", rank);

  FabricOptions options;
  options.provider = provider;
  options.address = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<Fabric>> opened = Fabric::open(options, 2);
  if (!opened.ok()) die(opened.status().ToString());
  Endpoint ep(*std::move(opened), wait == "fd");
  absl::StatusOr<std::string> name = ep.fabric().name();
  if (!name.ok()) die(name.status().ToString());
  store->set(absl::StrCat("name/", rank),
            std::vector<uint8_t>(name->begin(), name->end()));
  const std::vector<uint8_t> theirs =
      store->get(absl::StrCat("name/", 1 - rank));
  absl::StatusOr<std::vector<fi_addr_t>> peer =
      ep.fabric().insert({std::string(theirs.begin(), theirs.end())});
  if (!peer.ok()) die(peer.status().ToString());
  ep.peer = (*peer)[0];

  const size_t largest =
      std::min(size_t{64} << 20, static_cast<size_t>(flags.max_bytes));
  std::vector<char> buffer(std::max(largest, size_t{16} << 20), 'x');
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
      ep.fabric().register_memory(
          buffer.data(), buffer.size(),
          FI_SEND | FI_RECV | FI_READ |
              (ep.fabric().has_rma() ? FI_REMOTE_READ : 0));
  if (!region.ok()) die(region.status().ToString());
  void* desc = (*region)->desc();

  std::vector<Latency> latencies;
  for (size_t size : flags.sizes()) {
    latencies.push_back(
        tether::bench::time_round_trips(size, flags.rounds_of(size), [&] {
          round_trip(ep, rank, buffer.data(), desc, size);
        }));
  }
  std::vector<std::pair<size_t, double>> tagged;
  std::vector<std::pair<size_t, double>> reads;
  for (size_t size : {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20}) {
    const int count =
        static_cast<int>(std::max<size_t>(16, (size_t{1} << 30) / size / 2));
    tagged.emplace_back(
        size, tagged_bandwidth(ep, rank, buffer.data(), desc, size, count));
    if (ep.fabric().has_rma()) {
      // Rank 1 measures; rank 0 prints.
      const double measured =
          read_bandwidth(ep, rank, *store, buffer.data(), **region, size, count);
      const std::string key = absl::StrCat("read_gbps/", size);
      if (rank == 1) {
        const std::string text = absl::StrCat(measured);
        store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
      } else {
        const std::vector<uint8_t> text = store->get(key);
        double gbps = 0;
        (void)absl::SimpleAtod(std::string(text.begin(), text.end()), &gbps);
        reads.emplace_back(size, gbps);
      }
    }
  }
  if (rank == 1) {
    // Rank 0 serves the store: stay until it has read everything.
    store->get("done");
    return 0;
  }
  store->set("done", {1});

  std::printf("raw libfabric, provider %s, %s, between two processes\n",
              ep.fabric().provider_name().c_str(),
              ep.sleeps() ? "sleeping on the completion queue's fd"
                          : "polling the completion queue");
  tether::bench::print_latencies(latencies);
  std::vector<std::string> json;
  std::printf("%-24s %12s %12s\n", "bandwidth", "tagged GB/s", "read GB/s");
  for (size_t i = 0; i < tagged.size(); ++i) {
    const double read = i < reads.size() ? reads[i].second : 0;
    std::printf("%-24s %12.2f %12.2f\n",
                absl::StrCat(tagged[i].first, " B").c_str(), tagged[i].second,
                read);
    json.push_back(absl::StrCat("\"bw_", tagged[i].first,
                                "\": {\"tagged_gbps\": ", tagged[i].second,
                                ", \"read_gbps\": ", read, "}"));
  }
  std::printf("JSON {\"provider\": \"%s\", \"wait\": \"%s\", %s, %s}\n",
              ep.fabric().provider_name().c_str(), ep.sleeps() ? "fd" : "poll",
              tether::bench::sweep_json(latencies).c_str(),
              absl::StrJoin(json, ", ").c_str());
  return 0;
}
