#include "backends/tensorpipe/internal/settings.h"

#include <absl/strings/match.h>

#include <utility>

#include "backends/common/settings_toolkit.h"

namespace tether::backends::internal {
namespace {

constexpr char kTransportsKey[] = "tensorpipe.transports";
constexpr char kChannelsKey[] = "tensorpipe.channels";
constexpr char kMptLanesKey[] = "tensorpipe.mpt_lanes";
constexpr char kAddressKey[] = "tensorpipe.address";
constexpr char kInitTimeoutKey[] = "tensorpipe.init_timeout_ms";
constexpr char kHandshakeTimeoutKey[] = "tensorpipe.handshake_timeout_ms";

}  // namespace

absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw) {
  Settings settings;
  for (const auto& [key, value] : raw) {
    if (!absl::StartsWith(key, "tensorpipe.")) continue;  // another backend's
    if (key == kTransportsKey) {
      absl::StatusOr<std::vector<std::string>> names =
          common::parse_list(key, value, {"tcp", "uv", "shm"});
      if (!names.ok()) return names.status();
      settings.transports = *std::move(names);
    } else if (key == kChannelsKey) {
      absl::StatusOr<std::vector<std::string>> names =
          common::parse_list(key, value, {"basic", "cma", "mpt", "xth"});
      if (!names.ok()) return names.status();
      settings.channels = *std::move(names);
    } else if (key == kMptLanesKey) {
      absl::StatusOr<int64_t> lanes =
          common::parse_int(key, value, 1, kMaxMptLanes);
      if (!lanes.ok()) return lanes.status();
      settings.mpt_lanes = static_cast<int>(*lanes);
    } else if (key == kAddressKey) {
      absl::StatusOr<std::string> address = common::resolve_host(key, value);
      if (!address.ok()) return address.status();
      settings.address = *std::move(address);
    } else if (key == kInitTimeoutKey || key == kHandshakeTimeoutKey) {
      absl::StatusOr<absl::Duration> duration =
          common::parse_milliseconds(key, value, 1);
      if (!duration.ok()) return duration.status();
      (key == kInitTimeoutKey ? settings.init_timeout
                              : settings.handshake_timeout) = *duration;
    } else {
      return common::unknown_setting(
          key, "tensorpipe",
          {kTransportsKey, kChannelsKey, kMptLanesKey, kAddressKey,
           kInitTimeoutKey, kHandshakeTimeoutKey});
    }
  }
  return settings;
}

}  // namespace tether::backends::internal
