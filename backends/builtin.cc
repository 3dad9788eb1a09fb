#include "backends/builtin.h"

#include "backends/loopback/loopback_agent.h"

namespace tether::backends {

absl::Status register_builtin_backends(BackendRegistry& registry) {
  return registry.add(loopback_backend());
}

}  // namespace tether::backends
