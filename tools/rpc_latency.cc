// rpc_latency: small-call round-trip latency between two processes, per
// backend variant, beside a plain TCP ping-pong measured in the same run.
//
//   bazel build -c opt //tools:tether_run //tools:rpc_latency
//   bazel-bin/tools/tether_run --nproc 2 -- bazel-bin/tools/rpc_latency \
//       --calls=5000
//
// Rank 0 times every call (per-call samples, so p50 and p99 are real
// percentiles) of `aten::add.Scalar` on a 2-element float tensor, via
// rpc_sync to rank 1, for each variant in turn: TensorPipe over uv (TCP) only,
// over shm only, and with TensorPipe's own negotiation (all transports and
// channels); libfabric over tcp;ofi_rxm and over shm. With --no_tensors the call is a TorchScript `inc(int) -> int`
// instead (no storage travels). Then a raw TCP ping-pong (16-byte messages, TCP_NODELAY) between
// the same two processes. Prints a table and one JSON line.
#include <ATen/ATen.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/builtin.h"
#include "core/worker.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Variant {
  std::string label;
  std::string backend;
  absl::flat_hash_map<std::string, std::string> settings;
};

struct Result {
  std::string label;
  double p50_us = 0;
  double p99_us = 0;
};

Result summarize(const std::string& label, std::vector<double> samples_us) {
  std::sort(samples_us.begin(), samples_us.end());
  Result r;
  r.label = label;
  r.p50_us = samples_us[samples_us.size() / 2];
  r.p99_us = samples_us[std::min(samples_us.size() - 1,
                                 samples_us.size() * 99 / 100)];
  return r;
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  int out = -1;
  if (value == nullptr || !absl::SimpleAtoi(value, &out)) {
    std::fprintf(stderr, "rpc_latency: %s is not set; run under tether_run\n",
                 name);
    std::exit(2);
  }
  return out;
}

void die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "rpc_latency: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  std::exit(1);
}

// One variant: both ranks make a group on its own store port; rank 0 times.
absl::StatusOr<Result> run_variant(const Variant& variant, int rank,
                                   int store_port, int calls, bool tensors,
                                   const tether::BackendRegistry& registry) {
  tether::RpcOptions options;
  options.backend = variant.backend;
  options.init_method = absl::StrCat("tcp://127.0.0.1:", store_port);
  options.backend_settings = variant.settings;
  options.num_worker_threads = 2;
  options.scripts = {"def inc(x: int) -> int:\n    return x + 1\n"};
  absl::StatusOr<std::unique_ptr<tether::Worker>> worker = tether::Worker::create(
      absl::StrCat("w", rank), rank, 2, options, registry);
  if (!worker.ok()) return worker.status();
  Result result;
  if (rank == 0) {
    at::Tensor x = at::ones({2});
    std::vector<double> samples;
    samples.reserve(calls);
    const int warmup = std::max(100, calls / 10);
    for (int i = 0; i < warmup + calls; ++i) {
      Clock::time_point start = Clock::now();
      absl::StatusOr<c10::IValue> y =
          tensors ? (*worker)->rpc_sync(1, "aten::add.Scalar", {x, 1.0})
                  : (*worker)->rpc_sync(1, "inc", {int64_t{i}});
      double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (!y.ok()) return y.status();
      if (i >= warmup) samples.push_back(us);
    }
    result = summarize(variant.label, std::move(samples));
  }
  absl::Status down = (*worker)->shutdown();
  if (!down.ok()) return down;
  return result;
}

// A plain TCP ping-pong: rank 1 echoes, rank 0 times each round trip.
Result tcp_ping_pong(int rank, int port, int calls) {
  constexpr size_t kBytes = 16;
  char buffer[kBytes] = {};
  auto full = [](ssize_t (*op)(int, void*, size_t, int), int fd, char* data) {
    size_t done = 0;
    while (done < kBytes) {
      ssize_t n = op(fd, data + done, kBytes - done, 0);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  };
  auto recv_all = [&](int fd) { return full(::recv, fd, buffer); };
  auto send_all = [&](int fd) {
    return full([](int f, void* d, size_t n, int fl) {
      return ::send(f, d, n, fl);
    }, fd, buffer);
  };
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int one = 1;
  const int warmup = std::max(100, calls / 10);
  if (rank == 1) {
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listener, 1) != 0) {
      std::perror("rpc_latency: tcp listen");
      std::exit(1);
    }
    int fd = ::accept(listener, nullptr, nullptr);
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (int i = 0; i < warmup + calls; ++i) {
      if (!recv_all(fd) || !send_all(fd)) break;
    }
    ::close(fd);
    ::close(listener);
    return Result{};
  }
  int fd = -1;
  for (int attempt = 0; attempt < 500; ++attempt) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    ::close(fd);
    fd = -1;
    ::usleep(10000);  // the peer's listener is starting
  }
  if (fd < 0) {
    std::fprintf(stderr, "rpc_latency: cannot connect the TCP baseline\n");
    std::exit(1);
  }
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<double> samples;
  for (int i = 0; i < warmup + calls; ++i) {
    Clock::time_point start = Clock::now();
    if (!send_all(fd) || !recv_all(fd)) {
      std::fprintf(stderr, "rpc_latency: TCP baseline broke\n");
      std::exit(1);
    }
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (i >= warmup) samples.push_back(us);
  }
  ::close(fd);
  return summarize("raw TCP ping-pong (16 B)", std::move(samples));
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 5000;
  bool tensors = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--calls=", 0) == 0 && absl::SimpleAtoi(arg.substr(8), &calls) &&
        calls > 0) {
      continue;
    }
    if (arg == "--no_tensors") {
      tensors = false;
      continue;
    }
    std::fprintf(stderr, "usage: rpc_latency [--calls=N] [--no_tensors]\n");
    return 2;
  }
  const int rank = env_int("RANK");
  const int base_port = env_int("MASTER_PORT");
  if (env_int("WORLD_SIZE") != 2) {
    std::fprintf(stderr, "rpc_latency: run with --nproc 2\n");
    return 2;
  }
  tether::BackendRegistry registry;
  if (absl::Status s = tether::backends::register_builtin_backends(registry); !s.ok()) {
    die("registry", s);
  }
  const std::vector<Variant> variants = {
      {"tensorpipe uv (TCP)", "tensorpipe",
       {{"tensorpipe.transports", "uv"}, {"tensorpipe.channels", "basic"}}},
      {"tensorpipe uv + cma", "tensorpipe",
       {{"tensorpipe.transports", "uv"}, {"tensorpipe.channels", "cma"}}},
      {"tensorpipe shm", "tensorpipe",
       {{"tensorpipe.transports", "shm"}, {"tensorpipe.channels", "basic"}}},
      {"tensorpipe negotiated", "tensorpipe", {}},
      {"libfabric tcp;ofi_rxm", "libfabric",
       {{"libfabric.provider", "tcp;ofi_rxm"}}},
      {"libfabric shm", "libfabric", {{"libfabric.provider", "shm"}}},
  };
  std::vector<Result> results;
  for (size_t v = 0; v < variants.size(); ++v) {
    absl::StatusOr<Result> r = run_variant(
        variants[v], rank, base_port + 1 + static_cast<int>(v), calls, tensors,
        registry);
    if (!r.ok()) die(variants[v].label, r.status());
    results.push_back(*r);
  }
  Result tcp = tcp_ping_pong(rank, base_port + 10, calls);
  if (rank != 0) return 0;
  results.push_back(tcp);
  std::printf("rpc_sync(%s) round trip, %d calls each\n",
              tensors ? "aten::add.Scalar, 2 floats" : "TorchScript inc(int)",
              calls);
  std::printf("%-28s %10s %10s %14s\n", "variant", "p50 us", "p99 us",
              "p50 / raw TCP");
  std::vector<std::string> json;
  for (const Result& r : results) {
    std::printf("%-28s %10.1f %10.1f %14.2f\n", r.label.c_str(), r.p50_us,
                r.p99_us, r.p50_us / tcp.p50_us);
    json.push_back(absl::StrCat("\"", r.label, "\": {\"p50_us\": ", r.p50_us,
                                ", \"p99_us\": ", r.p99_us, "}"));
  }
  std::printf("JSON {%s}\n", absl::StrJoin(json, ", ").c_str());
  return 0;
}
