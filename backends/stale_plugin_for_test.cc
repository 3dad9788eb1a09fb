// A plugin from "another build", for backends:plugin_loading_test: its
// entry point answers as a plugin whose ABI id is not the program's does
// (backends/common/plugin_library.h, PluginEntry).
extern "C" __attribute__((visibility("default"))) const char*
tether_stale_backend(const char*, const void*, void*) {
  return "0123456789abcdef";
}
