// rss_probe: makes many small calls between two workers of one process and
// prints the process's RSS as it goes, to tell a leak from allocator noise
// and a backend's growth from core's (run it under heaptrack to see where).
//
//   bazel run //tools:rss_probe -- --backend=loopback --calls=200000
//   bazel run //tools:rss_probe -- --backend=tensorpipe --calls=200000
#include <ATen/ATen.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "backends/builtin.h"
#include "core/worker.h"

namespace {

int64_t rss_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "loopback";
  int64_t calls = 100000;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--backend=", 10) == 0) backend = argv[i] + 10;
    if (std::strncmp(argv[i], "--calls=", 8) == 0) {
      if (!absl::SimpleAtoi(argv[i] + 8, &calls)) return 2;
    }
  }
  tether::BackendRegistry registry;
  if (!tether::backends::register_builtin_backends(registry).ok()) return 1;
  tether::RpcOptions options;
  options.backend = backend;
  options.init_method = "memory://rss_probe";
  if (backend == "faulty") {
    options.backend_settings = {{"faulty.inner", "tensorpipe"},
                                {"faulty.jitter_ms", "1"}};
  }
  absl::StatusOr<std::unique_ptr<tether::Worker>> a, b;
  std::thread t([&] {
    b = tether::Worker::create("b", 1, 2, options, registry);
  });
  a = tether::Worker::create("a", 0, 2, options, registry);
  t.join();
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "rss_probe: %s %s\n", a.status().ToString().c_str(),
                 b.status().ToString().c_str());
    return 1;
  }
  const at::Tensor x = at::ones({2});
  for (int64_t i = 1; i <= calls; ++i) {
    absl::StatusOr<c10::IValue> r =
        (*a)->rpc_sync("b", "aten::add.Tensor", {x, x});
    if (!r.ok()) {
      std::fprintf(stderr, "call %lld: %s\n", static_cast<long long>(i),
                   r.status().ToString().c_str());
      return 1;
    }
    if (i % (calls / 10) == 0) {
      std::printf("%s: %lld calls, RSS %lld kB\n", backend.c_str(),
                  static_cast<long long>(i),
                  static_cast<long long>(rss_kb()));
      std::fflush(stdout);
    }
  }
  std::thread s([&] { (void)(*b)->shutdown(); });
  (void)(*a)->shutdown();
  s.join();
  return 0;
}
