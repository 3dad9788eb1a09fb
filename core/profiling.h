// Remote profiling: the peer's RPC profiling (torch.distributed.rpc under
// torch.autograd.profiler_legacy.profile), over LibTorch's legacy profiler.
//
// A request that runs user code (a CALL, a remote() or an RRef method
// call), sent from a thread that runs the legacy profiler, runs on its
// callee under a profiler with the caller's settings; the events the callee
// records come back with the response and join the caller's profile before
// the call completes, each marked remote, with the callee's rank as its
// node and named "<key>#remote_op: <event>". The key names the call; the
// Python front end gives the peer's ("rpc_async#fn(caller -> callee)").
// The kineto profiler (torch.profiler.profile) is not carried, as in the
// peer.
//
// The Worker does the wrapping (core/worker.cc): a profiled request travels
// as a PROFILED_REQUEST and its response as a PROFILED_RESPONSE (payloads
// in core/wire/profiled.h); backends move them as any other message. The
// callee serves the wrapped request as usual, on whatever threads serve it,
// each under Serving::state(), and what it calls onward from there is
// profiled in turn: those events come back nested under both keys.
//
// Thread safety: CallKey is per thread; Call and Serving may be used from
// any thread.
#ifndef TETHER_CORE_PROFILING_H_
#define TETHER_CORE_PROFILING_H_

#include <ATen/ThreadLocalState.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/wire/profiled.h"

namespace tether::profiling {

// Between a call's key and the name of each of its remote events (the
// peer's REMOTE_PROFILING_KEY_PREFIX).
inline constexpr absl::string_view kRemoteOpPrefix = "#remote_op: ";

// Whether this thread runs LibTorch's legacy profiler.
bool enabled();

// The state of a thread that has done nothing yet: no profiler, grad mode
// on. A request served on a thread in the middle of something else (a
// user's thread reading its answer off the socket: core/future.h's
// WaitAssist) runs under it, so that the user's profile, grad mode and the
// like neither see nor change it.
const at::ThreadLocalState& pristine_thread_state();

// While it lives, the profiled requests this thread sends are named `key`;
// without one, the Worker names a request after its type and workers.
class CallKey {
 public:
  explicit CallKey(std::string key);
  ~CallKey();
  CallKey(const CallKey&) = delete;
  CallKey& operator=(const CallKey&) = delete;

  // The innermost key of this thread, or null.
  static const std::string* current();

 private:
  std::string key_;
  const CallKey* previous_;
};

// The caller's side of one profiled request.
class Call {
 public:
  // The profile of this thread, or nullopt when it runs none.
  static std::optional<Call> begin(std::string key);

  const wire::ProfilerSettings& settings() const { return settings_; }

  // Adds a response's `events` to the profile the call was made in (from
  // any thread), named under the key and marked remote. INVALID_ARGUMENT
  // if LibTorch refuses one.
  absl::Status add(std::vector<wire::ProfiledEvent> events) const;

 private:
  std::string key_;
  wire::ProfilerSettings settings_;
  // The calling thread's debug info, which holds its profiler's state.
  std::shared_ptr<c10::ThreadLocalDebugInfo> profile_;
};

// The callee's side: a profiler with the caller's settings, shared by the
// threads that serve one request.
class Serving {
 public:
  // Whatever this thread runs (a user's thread may serve a request while
  // it waits for its own answer), the request's profile is its own.
  static absl::StatusOr<std::shared_ptr<Serving>> start(
      const wire::ProfilerSettings& settings);

  // The thread state to serve under (at::ThreadLocalStateGuard).
  const at::ThreadLocalState& state() const { return state_; }

  // Stops the profiler and returns what it recorded: the events recorded
  // here carry node `self`, those that came back from calls made onward
  // keep theirs.
  std::vector<wire::ProfiledEvent> finish(int32_t self);

  explicit Serving(at::ThreadLocalState state) : state_(std::move(state)) {}

 private:
  at::ThreadLocalState state_;
};

// Process-wide profiles of every request this process serves (the peer's
// rpc._server_process_global_profile): while one is on, each request that
// runs user code is served under a profiler with the settings of the
// latest started (as a caller's profiled request is), and its events go to
// every profile on, one list per request.
class ServerProfiles {
 public:
  using Events = std::vector<torch::autograd::profiler::LegacyEvent>;

  static int64_t start(const wire::ProfilerSettings& settings);
  // Stops profile `id` (another's stay on) and returns what it gathered;
  // empty for an id not on.
  static std::vector<Events> stop(int64_t id);
  // The settings to serve a request under, if any profile is on.
  static std::optional<wire::ProfilerSettings> settings();
  // Gives one served request's events to every profile on.
  static void add(const std::vector<wire::ProfiledEvent>& events);
};

}  // namespace tether::profiling

#endif  // TETHER_CORE_PROFILING_H_
