// Tests of remote profiling (core/profiling.h): running work under
// LibTorch's legacy profiler on this thread and finding its events.
#ifndef TETHER_TESTING_LEGACY_PROFILE_H_
#define TETHER_TESTING_LEGACY_PROFILE_H_

#include <torch/csrc/autograd/profiler_legacy.h>

#include <string>
#include <vector>

namespace tether::testing {

using LegacyEvents = std::vector<torch::autograd::profiler::LegacyEvent>;

// Runs `work` on this thread under the legacy profiler (recording input
// shapes) and returns every event the profile holds at its end, the
// remote events among them.
template <typename F>
LegacyEvents legacy_profile(F work) {
  namespace legacy = torch::autograd::profiler;
  legacy::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(
      torch::profiler::impl::ProfilerState::CPU,
      /*report_input_shapes=*/true));
  work();
  LegacyEvents out;
  for (auto& list : legacy::disableProfilerLegacy()) {
    for (auto& event : list) out.push_back(event);
  }
  return out;
}

// The events of `events` that begin a range named `name`.
inline LegacyEvents pushes_named(const LegacyEvents& events,
                                 const std::string& name) {
  LegacyEvents out;
  for (const auto& e : events) {
    if (e.kind() == torch::autograd::profiler::EventKind::PushRange &&
        e.name() == name) {
      out.push_back(e);
    }
  }
  return out;
}

// Every event's name, for failure messages.
inline std::vector<std::string> event_names(const LegacyEvents& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.name());
  return out;
}

}  // namespace tether::testing

#endif  // TETHER_TESTING_LEGACY_PROFILE_H_
