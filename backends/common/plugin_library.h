// Backend plugins: a backend built as its own shared library, which a
// program loads the first time the backend is used, so that a worker maps a
// transport's libraries (gRPC's seven) only when it chooses that backend.
//
// The program side (backends/builtin.cc): plugin_backend() registers a
// Backend whose viable() and create() find and open the library once per
// process and forward to the backend it hands back.
//
// Finding the library, in order (the first that exists and loads):
//   1. $TETHER_PLUGIN_DIR/<file>;
//   2. the directory of the object that holds this loader (the program, or
//      the Python extension tether/_C.so, or libtether.so), as it was
//      loaded and with its symbolic links resolved; then the program's;
//   3. Bazel runfiles: $RUNFILES_DIR, the runfiles tree that object or the
//      program sits in, or <object>.runfiles; each at
//      tether/<package>/<file>.
// Not found, or found and refused, is FAILED_PRECONDITION naming every path
// tried and why each failed (dlerror's text).
//
// The plugin side: the library exports exactly one C function (a linker
// version script makes everything else local, backends/grpc/BUILD.bazel), of
// type PluginEntry, which answers with answer_plugin(). The plugin carries
// its own private copy of the tether code it uses: neither copy interposes
// on the other.
//
// The ABI rule: what crosses between the program and the plugin (the
// Backend, AgentSetup, the Agent, Messages, futures and their callbacks,
// absl::Status) is laid out by the same headers compiled the same way, so
// the two must come from one build. TETHER_PLUGIN_ABI_ID (a hash of those
// headers, the compilation mode and the command line's --copt/--cxxopt, so
// a sanitizer config has its own: plugin_abi.bzl) is passed to the entry
// point, which refuses another build's id; the loader then fails with a
// Status naming both ids. Process-wide state of core that both copies hold
// is passed across explicitly where it matters (the wait poll policy, the
// layers' message type names: answer_plugin); docs/architecture.md section
// 2, "Backend plugins", lists the rest and why two copies are harmless.
//
// A plugin, once loaded, stays loaded until the process exits (its agents'
// threads and its statics may outlive any one agent).
//
// Thread safety: every function may be called from any thread.
#ifndef TETHER_BACKENDS_COMMON_PLUGIN_LIBRARY_H_
#define TETHER_BACKENDS_COMMON_PLUGIN_LIBRARY_H_

#include <absl/status/statusor.h>

#include <string>
#include <vector>

#include "core/backend_registry.h"
#include "core/message.h"

namespace tether::backends::common {

// What the program passes to a plugin's entry point beside the ABI id.
struct PluginHost {
  // The program's message_type_name: the names its layers registered.
  const char* (*message_type_name)(MessageType type);
};

// A plugin's one exported function. `abi_id` is the program's
// TETHER_PLUGIN_ABI_ID; if it is not the plugin's, the entry returns the
// plugin's id and touches nothing else (it may not read `host` or write
// `backend`, whose layouts may differ). Otherwise it fills `backend` and
// returns nullptr.
using PluginEntry = const char* (*)(const char* abi_id, const PluginHost* host,
                                    Backend* backend);

// A backend plugin as the program knows it.
struct PluginLibrary {
  // For messages: "the gRPC backend".
  std::string what;
  // The library's file name: "libtether_grpc.so".
  std::string file;
  // Its package in Bazel runfiles: "backends/grpc".
  std::string package;
  // The name of its PluginEntry.
  std::string entry;
};

// The backend `name` that `library` holds: its viable() is the plugin's
// (or why the plugin cannot be loaded), its create() the plugin's. Nothing
// is loaded until one of them is called.
Backend plugin_backend(std::string name, PluginLibrary library);

// Loads `library` (once per process: later calls return the same backend)
// and returns the backend it holds, which must be named `name`.
[[nodiscard]] absl::StatusOr<const Backend*> load_plugin_backend(
    const std::string& name, const PluginLibrary& library);

// The paths load_plugin_backend() tries for `library`, in order.
std::vector<std::string> plugin_candidates(const PluginLibrary& library);

// For a plugin's entry point: checks `abi_id` against this build's, takes
// over what the program passes, and fills `out` with `backend`, whose
// create() first makes this copy's waits poll as the program's do.
const char* answer_plugin(const char* abi_id, const PluginHost* host,
                          Backend backend, Backend* out);

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_PLUGIN_LIBRARY_H_
