#include "core/profiling.h"

#include <absl/base/thread_annotations.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <thread>
#include <utility>

namespace tether::profiling {
namespace {

namespace legacy = torch::autograd::profiler;
using torch::profiler::impl::ActiveProfilerType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

thread_local const CallKey* current_key = nullptr;

// LibTorch's events for `events`, each named `prefix` + its name. The codec
// checked the kinds and that the times are positive, which LibTorch asserts.
std::vector<legacy::LegacyEvent> legacy_events(
    std::vector<wire::ProfiledEvent> events, const std::string& prefix,
    bool remote) {
  std::vector<legacy::LegacyEvent> out;
  out.reserve(events.size());
  for (wire::ProfiledEvent& e : events) {
    out.emplace_back(static_cast<legacy::EventKind>(e.kind),
                     at::StringView(prefix + e.name),
                     static_cast<uint16_t>(e.thread_id), e.handle,
                     std::move(e.shapes), e.node_id, remote,
                     e.cpu_memory_usage, std::max<int64_t>(e.cpu_ns, 1),
                     /*cuda_recorded=*/false);
  }
  return out;
}

struct ServerProfile {
  int64_t id;
  wire::ProfilerSettings settings;
  std::vector<ServerProfiles::Events> gathered;
};

struct ServerProfileState {
  absl::Mutex mu;
  int64_t next_id ABSL_GUARDED_BY(mu) = 0;
  std::vector<ServerProfile> on ABSL_GUARDED_BY(mu);
  // How many are on: read without the lock on every request served.
  std::atomic<int> count{0};

  static ServerProfileState& get() {
    static ServerProfileState* state = new ServerProfileState();
    return *state;
  }
};

}  // namespace

const at::ThreadLocalState& pristine_thread_state() {
  static const at::ThreadLocalState* const state = [] {
    const at::ThreadLocalState* out = nullptr;
    std::thread([&out] { out = new at::ThreadLocalState(); }).join();
    return out;
  }();
  return *state;
}

bool enabled() {
  return torch::profiler::impl::profilerEnabled() &&
         torch::profiler::impl::profilerType() == ActiveProfilerType::LEGACY;
}

CallKey::CallKey(std::string key)
    : key_(std::move(key)), previous_(current_key) {
  current_key = this;
}

CallKey::~CallKey() { current_key = previous_; }

const std::string* CallKey::current() {
  return current_key == nullptr ? nullptr : &current_key->key_;
}

std::optional<Call> Call::begin(std::string key) {
  if (!enabled()) return std::nullopt;
  const ProfilerConfig config = torch::profiler::impl::getProfilerConfig();
  Call call;
  call.key_ = std::move(key);
  call.settings_.record_shapes = config.report_input_shapes;
  call.settings_.profile_memory = config.profile_memory;
  call.settings_.with_stack = config.with_stack;
  call.settings_.with_flops = config.with_flops;
  call.settings_.with_modules = config.with_modules;
  call.profile_ = c10::ThreadLocalDebugInfo::current();
  return call;
}

absl::Status Call::add(std::vector<wire::ProfiledEvent> events) const {
  try {
    std::vector<legacy::LegacyEvent> out = legacy_events(
        std::move(events), absl::StrCat(key_, kRemoteOpPrefix), true);
    c10::DebugInfoGuard guard(profile_);
    if (!enabled()) return absl::OkStatus();  // cannot be: the profile holds
    legacy::addEventList(std::move(out));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("LibTorch refused the remote events of ", key_, ": ",
                     e.what()));
  }
}

absl::StatusOr<std::shared_ptr<Serving>> Serving::start(
    const wire::ProfilerSettings& settings) {
  const ProfilerConfig config(ProfilerState::CPU, settings.record_shapes,
                              settings.profile_memory, settings.with_stack,
                              settings.with_flops, settings.with_modules);
  try {
    // Started here only to take a pristine thread state with the profiler
    // on; this thread goes back to its own.
    at::ThreadLocalStateGuard clean(pristine_thread_state());
    legacy::enableProfilerLegacy(config);
    auto serving = std::make_shared<Serving>(at::ThreadLocalState());
    legacy::disableProfilerLegacy(legacy::ProfilerDisableOptions(
        /*shouldCleanupTLSState=*/true, /*shouldConsolidate=*/false));
    return serving;
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("LibTorch's profiler did not start: ", e.what()));
  }
}

std::vector<wire::ProfiledEvent> Serving::finish(int32_t self) {
  legacy::thread_event_lists lists;
  try {
    at::ThreadLocalStateGuard guard(state_);
    lists = legacy::disableProfilerLegacy(legacy::ProfilerDisableOptions(
        /*shouldCleanupTLSState=*/false, /*shouldConsolidate=*/true));
  } catch (const std::exception&) {
    return {};  // finished already
  }
  std::vector<wire::ProfiledEvent> out;
  for (const std::vector<legacy::LegacyEvent>& list : lists) {
    for (const legacy::LegacyEvent& e : list) {
      wire::ProfiledEvent event;
      event.kind = static_cast<int>(e.kind());
      event.name = e.name();
      event.thread_id = e.threadId();
      event.handle = e.handle();
      event.shapes = e.shapes();
      event.node_id = e.isRemote() ? e.nodeId() : self;
      event.cpu_memory_usage = e.cpuMemoryUsage();
      event.cpu_ns = std::llround(e.cpuUs() * 1000.0);
      if (event.cpu_ns <= 0) continue;  // never recorded
      out.push_back(std::move(event));
    }
  }
  return out;
}

int64_t ServerProfiles::start(const wire::ProfilerSettings& settings) {
  ServerProfileState& state = ServerProfileState::get();
  absl::MutexLock lock(&state.mu);
  const int64_t id = state.next_id++;
  state.on.push_back(ServerProfile{id, settings, {}});
  state.count.store(static_cast<int>(state.on.size()));
  return id;
}

std::vector<ServerProfiles::Events> ServerProfiles::stop(int64_t id) {
  ServerProfileState& state = ServerProfileState::get();
  absl::MutexLock lock(&state.mu);
  for (auto it = state.on.begin(); it != state.on.end(); ++it) {
    if (it->id != id) continue;
    std::vector<Events> gathered = std::move(it->gathered);
    state.on.erase(it);
    state.count.store(static_cast<int>(state.on.size()));
    return gathered;
  }
  return {};
}

std::optional<wire::ProfilerSettings> ServerProfiles::settings() {
  ServerProfileState& state = ServerProfileState::get();
  if (state.count.load() == 0) return std::nullopt;
  absl::MutexLock lock(&state.mu);
  if (state.on.empty()) return std::nullopt;
  return state.on.back().settings;
}

void ServerProfiles::add(const std::vector<wire::ProfiledEvent>& events) {
  ServerProfileState& state = ServerProfileState::get();
  if (state.count.load() == 0 || events.empty()) return;
  absl::MutexLock lock(&state.mu);
  for (ServerProfile& profile : state.on) {
    profile.gathered.push_back(legacy_events(events, "", false));
  }
}

}  // namespace tether::profiling
