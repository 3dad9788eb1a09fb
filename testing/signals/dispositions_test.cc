// tether leaves a process's signals as it found them: a program that links
// it starts with no handler some library installed, and creating workers
// on each backend, calling between them and shutting them down change no
// disposition, but SIGPIPE's from the default to ignored
// (docs/reliability.md, "Signals"). Each case runs in a fresh process
// (testing/multiprocess.h), which exec started with every handler reset to
// the default: a handler there at the start came from a library's
// constructor.
//
// The libfabric cases also check where libfabric is loaded: never in a
// process that did not choose it, and when chosen, without the handlers of
// the providers it pulls in (libinfinipath's on loading, shm's on its
// first endpoint).
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "backends/builtin.h"
#include "core/worker.h"
#include "testing/multiprocess.h"
#include "testing/signal_dispositions.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::tether::testing::caught_signals;
using ::tether::testing::IsOk;
using ::tether::testing::library_mapped;
using ::tether::testing::proc_signal_sets;
using ::tether::testing::signal_changes;
using ::tether::testing::signal_dispositions;
using ::tether::testing::SignalDisposition;

struct Variant {
  const char* label;
  const char* backend;
  std::map<std::string, std::string> settings;
};

std::string describe_caught(const std::vector<SignalDisposition>& snapshot) {
  std::vector<std::string> lines;
  for (const SignalDisposition& disposition : snapshot) {
    if (disposition.is_caught()) {
      lines.push_back(absl::StrCat(disposition.signal, ": ",
                                   disposition.describe()));
    }
  }
  return absl::StrJoin(lines, "\n");
}

// Runs `f` on one thread per worker and waits for all.
template <typename F>
void on_each(std::vector<std::unique_ptr<Worker>>& workers, F f) {
  std::vector<std::thread> threads;
  for (auto& worker : workers) {
    threads.emplace_back([&f, &worker] { f(*worker); });
  }
  for (std::thread& thread : threads) thread.join();
}

// gtest names a case by its label.
void PrintTo(const Variant& variant, std::ostream* out) { *out << variant.label; }

class Dispositions : public ::testing::TestWithParam<Variant> {};

TEST_P(Dispositions, WorkersLeaveThemAsTheyWere) {
  const Variant variant = GetParam();
  ::tether::testing::run_in_processes(1, [&variant](int, int) {
    const bool chose_libfabric = std::string(variant.backend) == "libfabric";
    const std::vector<SignalDisposition> start = signal_dispositions();
    std::printf("%s at start: %s\n", variant.label, proc_signal_sets().c_str());
    EXPECT_TRUE(caught_signals(start).empty())
        << "handlers installed before main:\n" << describe_caught(start);
    EXPECT_FALSE(library_mapped("libfabric.so.1"))
        << "libfabric is loaded before any worker chose it";

    BackendRegistry registry;
    ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
    RpcOptions options;
    options.backend = variant.backend;
    options.backend_settings = {variant.settings.begin(),
                                variant.settings.end()};
    options.init_method = absl::StrCat("memory://dispositions_", variant.label);
    options.num_worker_threads = 2;
    options.default_timeout = absl::Seconds(60);
    std::vector<absl::StatusOr<std::unique_ptr<Worker>>> made(2);
    {
      std::vector<std::thread> threads;
      for (int rank = 0; rank < 2; ++rank) {
        threads.emplace_back([&, rank] {
          made[rank] = Worker::create(absl::StrCat("w", rank), rank, 2,
                                      options, registry);
        });
      }
      for (std::thread& thread : threads) thread.join();
    }
    std::vector<std::unique_ptr<Worker>> workers;
    for (auto& worker : made) {
      ASSERT_THAT(worker, IsOk());
      workers.push_back(std::move(*worker));
    }
    const std::vector<SignalDisposition> created = signal_dispositions();
    std::printf("%s after Worker::create: %s\n", variant.label,
                proc_signal_sets().c_str());
    EXPECT_EQ(signal_changes(start, created, /*allow_sigpipe_ignored=*/true),
              "")
        << "Worker::create changed these";
    EXPECT_EQ(library_mapped("libfabric.so.1"), chose_libfabric);

    // Small and large messages both ways (a large one is registered memory
    // and a rendezvous on libfabric).
    for (int64_t elements : {int64_t{4}, int64_t{1} << 20}) {
      absl::StatusOr<c10::IValue> sum = workers[0]->rpc_sync(
          "w1", "aten::add.Tensor", {at::ones({elements}), at::ones({elements})});
      ASSERT_THAT(sum, IsOk());
      EXPECT_EQ(sum->toTensor().sum().item<double>(), 2.0 * elements);
    }
    const std::vector<SignalDisposition> called = signal_dispositions();
    EXPECT_EQ(signal_changes(start, called, true), "") << "calls changed these";

    std::atomic<int> stopped{0};
    on_each(workers, [&stopped](Worker& worker) {
      if (worker.shutdown().ok()) ++stopped;
    });
    EXPECT_EQ(stopped.load(), 2);
    workers.clear();
    const std::vector<SignalDisposition> after = signal_dispositions();
    std::printf("%s after shutdown: %s\n", variant.label,
                proc_signal_sets().c_str());
    EXPECT_EQ(signal_changes(start, after, true), "")
        << "shutdown left these changed";
    EXPECT_EQ(library_mapped("libfabric.so.1"), chose_libfabric);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Backends, Dispositions,
    ::testing::Values(
        Variant{"tensorpipe", "tensorpipe", {}},
        Variant{"grpc", "grpc", {}},
        Variant{"libfabric_tcp", "libfabric",
                {{"libfabric.provider", "tcp;ofi_rxm"}}},
        Variant{"libfabric_shm", "libfabric", {{"libfabric.provider", "shm"}}}),
    [](const ::testing::TestParamInfo<Variant>& info) {
      return std::string(info.param.label);
    });

}  // namespace
}  // namespace tether
