#include "python/src/gil_profiling.h"

#include <chrono>

namespace tether::python {

void acquire_gil(std::optional<py::gil_scoped_acquire>& gil) {
  GilProfile& profile = GilProfile::get();
  if (!profile.on.load(std::memory_order_relaxed)) {
    gil.emplace();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  gil.emplace();
  const auto waited = std::chrono::steady_clock::now() - start;
  profile.wait_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count(),
      std::memory_order_relaxed);
  profile.waits.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace tether::python
