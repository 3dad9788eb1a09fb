// Plugins that the loader must refuse, for backends:plugin_loading_test
// (backends/common/plugin_library.h, PluginEntry): one of another build,
// whose entry point answers with its own ABI id, and one that holds a
// backend of another name than the one registered.
#include "backends/common/plugin_library.h"

extern "C" __attribute__((visibility("default"))) const char*
tether_stale_backend(const char*, const void*, void*) {
  return "0123456789abcdef";
}

extern "C" __attribute__((visibility("default"))) const char*
tether_misnamed_backend(const char* abi_id,
                        const tether::backends::common::PluginHost* host,
                        tether::Backend* backend) {
  tether::Backend other;
  other.name = "other";
  other.viable = [] { return absl::OkStatus(); };
  return tether::backends::common::answer_plugin(abi_id, host, std::move(other),
                                                 backend);
}
