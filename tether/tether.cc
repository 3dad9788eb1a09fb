#include "tether/tether.h"

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

}  // namespace tether
