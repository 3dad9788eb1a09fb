#include "backends/tensorpipe/internal/settings.h"

#include "backends/common/settings_toolkit.h"

namespace tether::backends::tensorpipe::internal {

absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw) {
  static const auto* const kTable = new common::SettingsTable<Settings>(
      "tensorpipe",
      {
          {"tensorpipe.transports",
           common::list_into(&Settings::transports, {"tcp", "uv", "shm"})},
          {"tensorpipe.channels",
           common::list_into(&Settings::channels,
                             {"basic", "cma", "cma_write", "mpt", "xth"})},
          {"tensorpipe.mpt_lanes",
           common::int_into(&Settings::mpt_lanes, 1, kMaxMptLanes)},
          {"tensorpipe.address", common::host_into(&Settings::address)},
          {"tensorpipe.init_timeout_ms",
           common::ms_into(&Settings::init_timeout, 1)},
          {"tensorpipe.handshake_timeout_ms",
           common::ms_into(&Settings::handshake_timeout, 1)},
      });
  Settings settings;
  if (absl::Status read = kTable->read(raw, settings); !read.ok()) return read;
  return settings;
}

}  // namespace tether::backends::tensorpipe::internal
