// The entry point of libtether_grpc.so, the gRPC backend as a plugin that
// backends/builtin.cc loads the first time a worker chooses "grpc"
// (backends/common/plugin_library.h). The library's only exported symbol
// (grpc_plugin.lds).
#include "backends/common/plugin_library.h"
#include "backends/grpc/grpc_agent.h"

extern "C" __attribute__((visibility("default"))) const char*
tether_grpc_backend(const char* abi_id,
                    const tether::backends::common::PluginHost* host,
                    tether::Backend* backend) {
  return tether::backends::common::answer_plugin(
      abi_id, host, tether::backends::grpc_backend(), backend);
}
