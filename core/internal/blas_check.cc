#include "core/internal/blas_check.h"

#include <absl/base/call_once.h>
#include <absl/strings/str_cat.h>
#include <c10/util/Logging.h>
#include <dlfcn.h>

namespace tether::internal {

std::optional<std::string> unsafe_blas() {
  // OpenBLAS's own queries, found among the process's libraries (LibTorch
  // links libopenblas.so.0 on Debian); absent with any other BLAS.
  using GetParallel = int (*)();
  using GetConfig = char* (*)();
  auto get_parallel = reinterpret_cast<GetParallel>(
      ::dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  if (get_parallel == nullptr || get_parallel() != 0) return std::nullopt;
  auto get_config =
      reinterpret_cast<GetConfig>(::dlsym(RTLD_DEFAULT, "openblas_get_config"));
  const char* config = get_config != nullptr ? get_config() : nullptr;
  return absl::StrCat(
      "the BLAS library in this process is OpenBLAS built without threads (",
      config != nullptr ? config : "openblas_get_parallel() is 0",
      "), which gives wrong results when several threads multiply matrices "
      "at once, as a worker's handlers may; on Debian install "
      "libopenblas0-pthread (scripts/setup.sh does)");
}

void warn_if_blas_unsafe() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    if (std::optional<std::string> why = unsafe_blas()) {
      LOG(WARNING) << "tether: " << *why;
    }
  });
}

}  // namespace tether::internal
