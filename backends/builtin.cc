#include "backends/builtin.h"

#include "backends/faulty/faulty_agent.h"
#include "backends/grpc/grpc_agent.h"
#include "backends/libfabric/libfabric_agent.h"
#include "backends/loopback/loopback_agent.h"
#include "backends/tensorpipe/tensorpipe_agent.h"

namespace tether::backends {

absl::Status register_builtin_backends(BackendRegistry& registry) {
  // The faulty backend finds the one it wraps in this same registry.
  for (Backend backend :
       {loopback_backend(), tensorpipe_backend(), grpc_backend(),
        libfabric_backend(), faulty_backend(&registry)}) {
    if (absl::Status added = registry.add(std::move(backend)); !added.ok()) {
      return added;
    }
  }
  return absl::OkStatus();
}

}  // namespace tether::backends
