#include "backends/builtin.h"

#include "backends/common/plugin_library.h"
#include "backends/faulty/faulty_agent.h"
#include "backends/libfabric/libfabric_agent.h"
#include "backends/loopback/loopback_agent.h"
#include "backends/tensorpipe/tensorpipe_agent.h"

namespace tether::backends {

absl::Status register_builtin_backends(BackendRegistry& registry) {
  // gRPC is a plugin, loaded when a worker first chooses it
  // (backends/grpc/BUILD.bazel): a worker on another backend does not map
  // gRPC's libraries.
  Backend grpc =
      common::plugin_backend("grpc", {"the gRPC backend", "libtether_grpc.so",
                                      "backends/grpc", "tether_grpc_backend"});
  // The faulty backend finds the one it wraps in this same registry.
  for (Backend backend :
       {loopback_backend(), tensorpipe_backend(), std::move(grpc),
        libfabric_backend(), faulty_backend(&registry)}) {
    if (absl::Status added = registry.add(std::move(backend)); !added.ok()) {
      return added;
    }
  }
  return absl::OkStatus();
}

}  // namespace tether::backends
