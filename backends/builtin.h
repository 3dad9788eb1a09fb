// The backends that ship with tether, for a BackendRegistry.
//
// The one place that knows every backend (docs/architecture.md section 1):
// `main` or a test builds its registry with
// register_builtin_backends(registry).
#ifndef TETHER_BACKENDS_BUILTIN_H_
#define TETHER_BACKENDS_BUILTIN_H_

#include "core/backend_registry.h"

namespace tether::backends {

// Adds "loopback" (in-process), "tensorpipe" (the default; TCP and shared
// memory between processes), "grpc" (gRPC streams, TLS optional;
// backends/grpc/grpc_agent.h; its plugin libtether_grpc.so is loaded when
// first used: backends/common/plugin_library.h), "libfabric" (libfabric RDM endpoints: TCP,
// shared memory, RDMA fabrics; backends/libfabric/libfabric_agent.h) and
// "faulty" (wraps another of `registry`'s backends to inject faults, for
// tests; backends/faulty/faulty_agent.h).
// Fails only if a name is already taken. `registry` must outlive its use of
// the faulty backend.
[[nodiscard]] absl::Status register_builtin_backends(BackendRegistry& registry);

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_BUILTIN_H_
