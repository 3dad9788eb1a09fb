// The tensorpipe backend's settings: the "tensorpipe.*" keys of
// AgentSetup::settings (backends/tensorpipe/tensorpipe_agent.h lists them),
// read with the settings toolkit (backends/common/settings_toolkit.h) as the
// other backends read theirs.
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_SETTINGS_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_SETTINGS_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <string>
#include <vector>

namespace tether::backends::tensorpipe::internal {

inline constexpr int kMaxMptLanes = 64;

struct Settings {
  // "tcp" is tether's guarded transport (internal/tcp_transport.h); "uv"
  // and "shm" are TensorPipe's own, which a stranger's bytes can crash
  // (docs/security.md), so only on request.
  std::vector<std::string> transports = {"tcp"};
  // One CPU channel wins per pipe (cma_write within a host, basic across
  // hosts). cma_write is tether's (internal/cma_write_channel.h): the
  // sender writes, where TensorPipe's cma has the receiver read and pin
  // the sender's pages (docs/benchmarks.md, "64 MiB: who copies"); cma
  // stays on request. mpt is opt-in: its lanes listen and run a loop each
  // in every worker, used or not (docs/decisions.md, "TensorPipe: one pipe
  // per pair of workers, mpt on request").
  std::vector<std::string> channels = {"basic", "cma_write"};
  int mpt_lanes = 2;
  // What the uv transport listens on: "ip" or "ip:port", IPv6 in brackets.
  std::string address = "127.0.0.1";
  absl::Duration init_timeout = absl::Seconds(60);
  absl::Duration handshake_timeout = absl::Seconds(10);
};

// Parses the "tensorpipe.*" keys of `raw` (others belong to other
// backends). INVALID_ARGUMENT naming the key for an unknown key or a bad
// value.
[[nodiscard]] absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw);

}  // namespace tether::backends::tensorpipe::internal

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_SETTINGS_H_
