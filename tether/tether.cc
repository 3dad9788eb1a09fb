#include "tether/tether.h"

#include <cstdlib>
#include <iostream>

#include "backends/builtin.h"

namespace tether {

absl::Status init_rpc(const std::string& name, int rank, int world_size,
                      const RpcOptions& options) {
  // The registry only builds agents at init: it may go when init returns.
  BackendRegistry registry;
  if (absl::Status added = backends::register_builtin_backends(registry);
      !added.ok()) {
    return added;
  }
  return init_rpc(name, rank, world_size, options, registry,
                  {rref_extension(), autograd::autograd_extension()});
}

absl::Status init_rpc(const std::string& name, const RpcOptions& options) {
  return init_rpc(name, -1, -1, options);
}

RpcOptions options_from_environment() {
  RpcOptions options;
  const char* backend = std::getenv("TETHER_BACKEND");
  if (backend != nullptr && backend[0] != '\0') options.backend = backend;
  return options;
}

int run_main(const std::function<absl::Status(int rank)>& worker) {
  absl::StatusOr<LauncherEnv> env = launcher_env();
  absl::Status status = env.ok() ? worker(env->rank) : env.status();
  if (!status.ok()) std::cerr << status << std::endl;
  return status.ok() ? 0 : 1;
}

absl::Status init_rpc(const std::string& name) {
  return init_rpc(name, options_from_environment());
}

}  // namespace tether
