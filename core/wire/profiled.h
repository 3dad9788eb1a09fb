// The payloads of PROFILED_REQUEST and PROFILED_RESPONSE (core/message.h;
// core/profiling.h gives them meaning), made and read by profiled.cc. Each
// wraps a message as it would travel otherwise: its type and payload go
// into the wrapper's payload, its id and storages stay the wrapper's.
#ifndef TETHER_CORE_WIRE_PROFILED_H_
#define TETHER_CORE_WIRE_PROFILED_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/message.h"
#include "core/wire/codec.h"

namespace tether::wire {

// What the caller's profiler records (LibTorch's ProfilerConfig, CPU).
struct ProfilerSettings {
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
  bool with_modules = false;
};

// One event of LibTorch's legacy profiler as it travels.
struct ProfiledEvent {
  // 0 mark, 1 push (a range begins), 2 pop (it ends), 3 memory allocation.
  int kind = 0;
  std::string name;
  uint64_t thread_id = 0;
  // Pairs a push with its pop.
  uint64_t handle = 0;
  std::vector<std::vector<int64_t>> shapes;
  // The rank of the worker that recorded it.
  int32_t node_id = -1;
  int64_t cpu_memory_usage = 0;
  // Nanoseconds of the recording worker's clock; positive.
  int64_t cpu_ns = 0;
};

inline constexpr int kMaxProfiledEventKind = 3;

// `inner` (a request) as a PROFILED_REQUEST run with `settings`.
[[nodiscard]] absl::StatusOr<Message> wrap_profiled_request(
    Message inner, const ProfilerSettings& settings);
// The request a PROFILED_REQUEST wraps, and its settings. Never crashes:
// a malformed payload is INVALID_ARGUMENT naming what is wrong, one over
// `limits` RESOURCE_EXHAUSTED. The inner type is the caller's to check.
[[nodiscard]] absl::StatusOr<Message> unwrap_profiled_request(
    Message in, ProfilerSettings& settings, const Limits& limits = Limits());
// `inner` (a response) as a PROFILED_RESPONSE carrying `events`.
[[nodiscard]] absl::StatusOr<Message> wrap_profiled_response(
    Message inner, const std::vector<ProfiledEvent>& events);
// The response a PROFILED_RESPONSE wraps, and its events, each checked
// (a known kind, a positive time, shapes within limits.max_tensor_dims).
[[nodiscard]] absl::StatusOr<Message> unwrap_profiled_response(
    Message in, std::vector<ProfiledEvent>& events,
    const Limits& limits = Limits());

}  // namespace tether::wire

#endif  // TETHER_CORE_WIRE_PROFILED_H_
