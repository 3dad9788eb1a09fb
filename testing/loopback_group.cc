#include "testing/loopback_group.h"

#include <absl/strings/str_cat.h>

#include <atomic>
#include <thread>
#include <utility>

#include "backends/builtin.h"

namespace tether::testing {

RpcOptions group_options(absl::string_view prefix, int threads) {
  static std::atomic<int> counter{0};
  RpcOptions options;
  options.backend = "loopback";
  options.init_method = absl::StrCat("memory://", prefix, "_", counter++);
  options.num_worker_threads = threads;
  options.default_timeout = kGroupBound;
  return options;
}

std::vector<std::unique_ptr<Worker>> start_group(
    const BackendRegistry& registry, const RpcOptions& options,
    const std::vector<std::string>& names,
    const std::vector<ExtensionFactory>& extensions) {
  std::vector<std::unique_ptr<Worker>> workers(names.size());
  std::vector<std::thread> threads;
  const int size = static_cast<int>(names.size());
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Worker>> w = Worker::create(
          names[rank], rank, size, options, registry, extensions);
      if (!w.ok()) {
        ADD_FAILURE() << "worker " << names[rank] << ": " << w.status();
        return;
      }
      workers[rank] = *std::move(w);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return workers;
}

std::vector<std::unique_ptr<Worker>> start_group(
    const RpcOptions& options, const std::vector<std::string>& names,
    const std::vector<ExtensionFactory>& extensions) {
  BackendRegistry registry;
  absl::Status registered = backends::register_builtin_backends(registry);
  if (!registered.ok()) {
    ADD_FAILURE() << "the builtin backends: " << registered;
    return std::vector<std::unique_ptr<Worker>>(names.size());
  }
  return start_group(registry, options, names, extensions);
}

absl::Status shutdown_group(std::vector<std::unique_ptr<Worker>>& workers) {
  std::vector<absl::Status> results(workers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    Worker* worker = workers[i].get();
    if (worker == nullptr) continue;
    threads.emplace_back([worker, &result = results[i]] {
      absl::Status stopped = worker->shutdown();
      if (!stopped.ok()) {
        result = absl::Status(
            stopped.code(), absl::StrCat(worker->get_current_worker_info().name,
                                         ": ", stopped.message()));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& result : results) {
    if (!result.ok()) return result;
  }
  return absl::OkStatus();
}

void LoopbackGroup::start(const RpcOptions& options,
                          const std::vector<std::string>& names,
                          const std::vector<ExtensionFactory>& extensions) {
  workers_ = start_group(options, names, extensions);
  for (const auto& w : workers_) ASSERT_NE(w, nullptr);
}

void LoopbackGroup::TearDown() {
  absl::Status stopped = shutdown_group(workers_);
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace tether::testing
