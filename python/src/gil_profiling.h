// GIL profiling for tether._C (the peer's rpc.enable_gil_profiling).
#ifndef TETHER_PYTHON_SRC_GIL_PROFILING_H_
#define TETHER_PYTHON_SRC_GIL_PROFILING_H_

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <optional>

namespace tether::python {

namespace py = pybind11;

// GIL profiling (the peer's rpc.enable_gil_profiling): while on, every
// Python function a peer calls here counts how long its pool thread waited
// for the GIL; agent_debug_info reports the average.
struct GilProfile {
  std::atomic<bool> on{false};
  std::atomic<int64_t> waits{0};
  std::atomic<int64_t> wait_ns{0};

  static GilProfile& get() {
    // Leaked, as futures.cc's Completer.
    static GilProfile* profile = new GilProfile();
    return *profile;
  }
};

// Takes the GIL into `gil`, timing the wait when GIL profiling is on.
void acquire_gil(std::optional<py::gil_scoped_acquire>& gil);

}  // namespace tether::python

#endif  // TETHER_PYTHON_SRC_GIL_PROFILING_H_
