#include "backends/libfabric/internal/fabric_library.h"

#include <absl/status/status.h>
#include <absl/strings/str_cat.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backends/libfabric/internal/kept_signals.h"

namespace tether::backends::libfabric::internal {
namespace {

// Resolves `name` at `version` into `*slot`; false (with the loader's
// reason in `*error`) when the library lacks it.
template <typename F>
bool resolve(void* handle, const char* name, const char* version, F* slot,
             std::string* error) {
  void* symbol = ::dlvsym(handle, name, version);
  if (symbol == nullptr) {
    const char* reason = ::dlerror();
    *error = absl::StrCat(name, "@", version, ": ",
                          reason != nullptr ? reason : "not found");
    return false;
  }
  *slot = reinterpret_cast<F>(symbol);
  return true;
}

absl::Status cannot_load(const char* file, absl::string_view reason) {
  return absl::FailedPreconditionError(
      absl::StrCat("the libfabric backend needs ", file,
                   ", which cannot be loaded: ", reason,
                   " (Debian: install the libfabric1 package)"));
}

std::atomic<const FabricLibrary*> loaded{nullptr};

// While it lives, the process's environment (`environ`) is a copy of its
// own plus IPATH_NO_BACKTRACE=1: libinfinipath's constructor reads that
// variable and, set to anything, installs no handler (checked with this
// machine's library). The copy is published by swapping the `environ`
// pointer, not with setenv(): a getenv() on another thread walks either
// array whole, where setenv() may move the array under it. The copy is
// never freed, since such a getenv() may still be walking it after the
// swap back; one per load, and a process loads libfabric once. When
// another thread changed the environment meanwhile (its setenv() made a
// new array from the copy), that array stays, variable included. A
// program that set IPATH_NO_BACKTRACE itself is left as it is.
class WithoutPsmBacktraceHandlers {
 public:
  WithoutPsmBacktraceHandlers() {
    if (::getenv(kSwitch) != nullptr) return;
    original_ = environ;
    size_t count = 0;
    while (original_ != nullptr && original_[count] != nullptr) ++count;
    copy_ = new char*[count + 2];
    std::copy(original_, original_ + count, copy_);
    copy_[count] = const_cast<char*>(kSetting);
    copy_[count + 1] = nullptr;
    environ = copy_;
  }
  ~WithoutPsmBacktraceHandlers() {
    if (copy_ != nullptr && environ == copy_) environ = original_;
  }
  WithoutPsmBacktraceHandlers(const WithoutPsmBacktraceHandlers&) = delete;
  WithoutPsmBacktraceHandlers& operator=(const WithoutPsmBacktraceHandlers&) =
      delete;

 private:
  static constexpr char kSwitch[] = "IPATH_NO_BACKTRACE";
  static constexpr char kSetting[] = "IPATH_NO_BACKTRACE=1";
  char** original_ = nullptr;
  char** copy_ = nullptr;
};

}  // namespace

absl::StatusOr<FabricLibrary> open_fabric_library(const char* file) {
  void* handle = nullptr;
  {
    KeptSignals kept("dlopen libfabric");
    WithoutPsmBacktraceHandlers quiet;
    handle = ::dlopen(file, RTLD_NOW | RTLD_LOCAL);
  }
  if (handle == nullptr) {
    const char* reason = ::dlerror();
    return cannot_load(file, reason != nullptr ? reason : "dlopen failed");
  }
  // The versions a program linked with -lfabric against libfabric 1.17
  // records (readelf --dyn-syms shows them), matching the headers' ABI.
  FabricLibrary library;
  std::string error;
  if (!resolve(handle, "fi_getinfo", "FABRIC_1.3", &library.getinfo, &error) ||
      !resolve(handle, "fi_freeinfo", "FABRIC_1.3", &library.freeinfo,
               &error) ||
      !resolve(handle, "fi_dupinfo", "FABRIC_1.3", &library.dupinfo, &error) ||
      !resolve(handle, "fi_fabric", "FABRIC_1.1", &library.fabric, &error) ||
      !resolve(handle, "fi_strerror", "FABRIC_1.0", &library.strerror,
               &error)) {
    // Not closed: its constructors ran, and a library is not guaranteed
    // to unload cleanly after that.
    return cannot_load(file, absl::StrCat("it has no ", error));
  }
  return library;
}

absl::StatusOr<const FabricLibrary*> fabric_library() {
  static const absl::StatusOr<const FabricLibrary*>* const opened =
      []() -> absl::StatusOr<const FabricLibrary*>* {
    absl::StatusOr<FabricLibrary> library =
        open_fabric_library(kFabricLibraryName);
    if (!library.ok()) {
      return new absl::StatusOr<const FabricLibrary*>(library.status());
    }
    const FabricLibrary* table = new FabricLibrary(*library);
    loaded.store(table, std::memory_order_release);
    return new absl::StatusOr<const FabricLibrary*>(table);
  }();
  return *opened;
}

const FabricLibrary* loaded_fabric_library() {
  return loaded.load(std::memory_order_acquire);
}

}  // namespace tether::backends::libfabric::internal
