#include "bench/layer_bench.h"

#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>

#include <memory>

#include "autograd/autograd_testing.h"
#include "backends/builtin.h"

namespace tether::bench {

Worker* worker_a(benchmark::State& state, const std::string& backend) {
  static absl::Mutex mu;
  // Never destroyed: the workers serve until the process exits.
  static auto* registry = new BackendRegistry;
  static auto* groups =
      new absl::flat_hash_map<std::string, std::vector<std::unique_ptr<Worker>>>;
  absl::MutexLock lock(&mu);
  if (registry->names().empty()) {
    if (absl::Status s = backends::register_builtin_backends(*registry); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return nullptr;
    }
  }
  auto it = groups->find(backend);
  if (it == groups->end()) {
    RpcOptions options;
    options.backend = backend;
    options.init_method = "memory://bench-" + backend;
    it = groups->emplace(backend, testing::start_autograd_workers(
                                      *registry, options, {"a", "b"}))
             .first;
  }
  Worker* a = it->second.empty() ? nullptr : it->second.front().get();
  if (a == nullptr) state.SkipWithError("the workers did not start");
  return a;
}

}  // namespace tether::bench
