#include "backends/common/plugin_library.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "backends/common/plugin_abi.h"
#include "core/future.h"

namespace tether::backends::common {
namespace {

// The repository's name in runfiles (WORKSPACE; also the name a project
// that depends on tether gives it: README).
constexpr char kWorkspace[] = "tether";

// An address inside the object that holds this loader.
void here() {}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string program() {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return n > 0 ? std::string(exe, n) : std::string();
}

// The path of the object that holds this loader, as it was loaded (the
// program's own, or a shared library's: tether/_C.so, libtether.so, or a
// test's library in Bazel's _solib).
std::string loader_object() {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&here), &info,
              reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0 &&
      map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0') {
    return map->l_name;
  }
  return program();
}

std::string resolved(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (real == nullptr) return path;
  std::string out(real);
  std::free(real);
  return out;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Once per process and file: the backends of the plugins loaded so far
// (never unloaded, never destroyed).
struct Loaded {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::unique_ptr<Backend>> backends
      ABSL_GUARDED_BY(mu);
};

Loaded& loaded() {
  static Loaded* const instance = new Loaded();
  return *instance;
}

// Opens `path` and asks its entry point for the backend named `name`; why
// not otherwise (the library is closed again).
absl::StatusOr<Backend> open_plugin(const std::string& path,
                                    const std::string& name,
                                    const PluginLibrary& library) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    return absl::FailedPreconditionError(error != nullptr ? error
                                                          : "dlopen failed");
  }
  auto refuse = [handle](std::string why) {
    ::dlclose(handle);
    return absl::FailedPreconditionError(std::move(why));
  };
  auto entry =
      reinterpret_cast<PluginEntry>(::dlsym(handle, library.entry.c_str()));
  if (entry == nullptr) {
    const char* error = ::dlerror();
    return refuse(absl::StrCat("no entry point ", library.entry, ": ",
                               error != nullptr ? error : "dlsym failed"));
  }
  const PluginHost host{&message_type_name};
  Backend backend;
  if (const char* theirs = entry(TETHER_PLUGIN_ABI_ID, &host, &backend)) {
    return refuse(absl::StrCat(
        "it comes from another build (its ABI id ", theirs, ", this program's ",
        TETHER_PLUGIN_ABI_ID, "); use the one built with this program"));
  }
  if (backend.name != name) {
    std::string why = absl::StrCat("it holds the backend '", backend.name,
                                   "', not '", name, "'");
    backend = Backend();  // its functions' code goes with the library
    return refuse(std::move(why));
  }
  return backend;
}

}  // namespace

std::vector<std::string> plugin_candidates(const PluginLibrary& library) {
  std::vector<std::string> paths;
  auto add = [&paths, &library](const std::string& directory) {
    if (directory.empty()) return;
    std::string path = absl::StrCat(directory, "/", library.file);
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
      paths.push_back(std::move(path));
    }
  };
  const std::string in_runfiles =
      absl::StrCat("/", kWorkspace, "/", library.package);
  add(env("TETHER_PLUGIN_DIR"));
  // The loader's object as loaded and resolved, then the program (when the
  // loader is a library of its own, as in Bazel's tests).
  const std::string object = loader_object();
  const std::string exe = program();
  std::vector<std::string> objects;
  for (const std::string& path : {object, resolved(object), exe}) {
    if (!path.empty() &&
        std::find(objects.begin(), objects.end(), path) == objects.end()) {
      objects.push_back(path);
    }
  }
  for (const std::string& path : objects) add(directory_of(path));
  if (std::string runfiles = env("RUNFILES_DIR"); !runfiles.empty()) {
    add(runfiles + in_runfiles);
  }
  for (const std::string& path : objects) {
    if (size_t at = path.find(".runfiles/"); at != std::string::npos) {
      add(path.substr(0, at + std::strlen(".runfiles")) + in_runfiles);
    }
    add(path + ".runfiles" + in_runfiles);
  }
  return paths;
}

absl::StatusOr<const Backend*> load_plugin_backend(
    const std::string& name, const PluginLibrary& library) {
  Loaded& plugins = loaded();
  absl::MutexLock lock(&plugins.mu);
  if (auto found = plugins.backends.find(library.file);
      found != plugins.backends.end()) {
    return found->second.get();
  }
  std::vector<std::string> tried;
  bool present = false;
  for (const std::string& path : plugin_candidates(library)) {
    if (::access(path.c_str(), F_OK) != 0) {
      tried.push_back(absl::StrCat(path, ": absent"));
      continue;
    }
    present = true;
    absl::StatusOr<Backend> opened = open_plugin(path, name, library);
    if (!opened.ok()) {
      tried.push_back(absl::StrCat(path, ": ", opened.status().message()));
      continue;
    }
    auto backend = std::make_unique<Backend>(*std::move(opened));
    const Backend* out = backend.get();
    plugins.backends.emplace(library.file, std::move(backend));
    return out;
  }
  const std::string list = absl::StrJoin(tried, "; ");
  if (!present) {
    return absl::NotFoundError(absl::StrCat(
        library.what, "'s library ", library.file, " was not found (tried: ",
        list, "); set TETHER_PLUGIN_DIR to the directory that holds it"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      library.what, "'s library ", library.file,
      " cannot be loaded (tried: ", list,
      "); set TETHER_PLUGIN_DIR to the directory of the one built with "
      "this program"));
}

Backend plugin_backend(std::string name, PluginLibrary library) {
  Backend backend;
  backend.name = name;
  backend.viable = [name, library]() -> absl::Status {
    absl::StatusOr<const Backend*> loaded = load_plugin_backend(name, library);
    if (!loaded.ok()) return loaded.status();
    if (!(*loaded)->viable) return absl::OkStatus();
    return (*loaded)->viable();
  };
  backend.create =
      [name = std::move(name), library = std::move(library)](
          AgentSetup setup) -> absl::StatusOr<std::unique_ptr<Agent>> {
    absl::StatusOr<const Backend*> loaded = load_plugin_backend(name, library);
    if (!loaded.ok()) return loaded.status();
    return (*loaded)->create(std::move(setup));
  };
  return backend;
}

const char* answer_plugin(const char* abi_id, const PluginHost* host,
                          Backend backend, Backend* out) {
  if (abi_id == nullptr || std::strcmp(abi_id, TETHER_PLUGIN_ABI_ID) != 0) {
    return TETHER_PLUGIN_ABI_ID;
  }
  if (host != nullptr && host->message_type_name != nullptr) {
    internal::name_message_types_with(host->message_type_name);
  }
  // The program's Worker set its own copy's wait policy from the same
  // setup (core/worker.cc); waits in this copy's code follow it too.
  backend.create = [create = std::move(backend.create)](AgentSetup setup) {
    internal::poll_waits_with(setup.poll);
    return create(std::move(setup));
  };
  *out = std::move(backend);
  return nullptr;
}

}  // namespace tether::backends::common
