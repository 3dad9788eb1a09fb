// signal_victim: a process of two tether workers, for the tests that
// signal a worker (testing/signals/fatal_signals_test.cc).
//
//   signal_victim BACKEND SETTINGS MODE
//
// BACKEND is a registry name, SETTINGS its settings as "key=value,..." (or
// "-" for none). The process creates workers w0 and w1 over a memory://
// rendezvous on that backend, so their messages cross the backend's real
// transport on loopback, and w0 calls w1's function MODE from its main
// thread:
//   busy   w1 prints "spinning" and multiplies matrices for ever on a pool
//          thread while w0's main thread waits for the answer: the test
//          sends SIGTERM then;
//   abort  w1 calls std::abort();
//   segv   w1 writes through a null pointer.
// It exits with 2 if the workers cannot be made or the call returns.
#include <ATen/ATen.h>
#include <absl/strings/str_split.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/builtin.h"
#include "core/worker.h"

namespace {

using ::tether::BackendRegistry;
using ::tether::RpcOptions;
using ::tether::Worker;

// Read at run time, so the compiler cannot see the write is through null.
volatile uintptr_t null_address = 0;

int64_t spin() {
  std::printf("spinning\n");
  std::fflush(stdout);
  at::Tensor a = at::rand({128, 128});
  for (;;) a = at::mm(a, a).div_(a.norm());
}

int64_t crash_by_abort() { std::abort(); }

int64_t crash_by_segv() {
  *reinterpret_cast<volatile int*>(null_address) = 1;
  return 0;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "signal_victim: %s\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return fail("usage: signal_victim BACKEND SETTINGS MODE");
  // The tests check how the process ends, not what it leaves behind.
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);

  BackendRegistry registry;
  if (!tether::backends::register_builtin_backends(registry).ok()) {
    return fail("no backends");
  }
  RpcOptions options;
  options.backend = argv[1];
  if (std::string(argv[2]) != "-") {
    for (absl::string_view entry : absl::StrSplit(argv[2], ',')) {
      std::pair<std::string, std::string> pair =
          absl::StrSplit(entry, absl::MaxSplits('=', 1));
      options.backend_settings[pair.first] = pair.second;
    }
  }
  options.init_method = "memory://signal_victim";
  options.num_worker_threads = 2;
  options.default_timeout = absl::ZeroDuration();  // none

  std::vector<absl::StatusOr<std::unique_ptr<Worker>>> workers(2);
  {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        workers[rank] = Worker::create(rank == 0 ? "w0" : "w1", rank, 2,
                                       options, registry);
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
  for (const auto& worker : workers) {
    if (!worker.ok()) return fail(worker.status().ToString());
  }
  Worker& w1 = **workers[1];
  if (!w1.register_function("busy", spin).ok() ||
      !w1.register_function("abort", crash_by_abort).ok() ||
      !w1.register_function("segv", crash_by_segv).ok()) {
    return fail("cannot register the functions");
  }
  std::printf("calling %s\n", argv[3]);
  std::fflush(stdout);
  absl::StatusOr<c10::IValue> result = (*workers[0])->rpc_sync("w1", argv[3], {});
  return fail("the call returned: " + result.status().ToString());
}
