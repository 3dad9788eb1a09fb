#include "backends/libfabric/internal/settings.h"

#include <absl/status/status.h>
#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include "backends/common/settings_toolkit.h"

namespace tether::backends::libfabric::internal {
namespace {

using common::parse_int;
using common::parse_milliseconds;

constexpr char kProviderKey[] = "libfabric.provider";
constexpr char kAddressKey[] = "libfabric.address";
constexpr char kThresholdKey[] = "libfabric.rendezvous_threshold";
constexpr char kRendezvousKey[] = "libfabric.rendezvous";
constexpr char kCreditsKey[] = "libfabric.credits";
constexpr char kPeerTimeoutKey[] = "libfabric.peer_timeout_ms";
constexpr char kInitTimeoutKey[] = "libfabric.init_timeout_ms";
constexpr char kAcceptTimeoutKey[] = "libfabric.accept_timeout_ms";
constexpr char kCacheEntriesKey[] = "libfabric.mr_cache_entries";
constexpr char kCacheBytesKey[] = "libfabric.mr_cache_bytes";
constexpr char kSpinKey[] = "libfabric.spin_us";

constexpr uint64_t kMinThreshold = 256;
constexpr uint64_t kMaxThreshold = uint64_t{64} << 20;
constexpr int64_t kMaxCredits = 1024;
constexpr int64_t kDayMs = int64_t{24} * 3600 * 1000;

// "" as is (the provider picks), else an IP literal or a network
// interface's address (the toolkit's wording on failure). libfabric takes
// an IPv6 address without the brackets the toolkit puts around it.
absl::StatusOr<std::string> resolve_address(const std::string& value) {
  if (value.empty()) return value;
  absl::StatusOr<std::string> host = common::resolve_host(kAddressKey, value);
  if (!host.ok()) return host.status();
  if (absl::StartsWith(*host, "[") && absl::EndsWith(*host, "]")) {
    return host->substr(1, host->size() - 2);
  }
  return host;
}

}  // namespace

const char* rendezvous_mode_name(RendezvousMode mode) {
  switch (mode) {
    case RendezvousMode::kAuto:
      return "auto";
    case RendezvousMode::kRead:
      return "read";
    case RendezvousMode::kTagged:
      return "tagged";
  }
  return "?";
}

absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw) {
  Settings settings;
  for (const auto& [key, raw_value] : raw) {
    if (key.rfind("libfabric.", 0) != 0) continue;  // another backend's
    const std::string value(absl::StripAsciiWhitespace(raw_value));
    absl::StatusOr<int64_t> number = 0;
    absl::StatusOr<absl::Duration> duration = absl::ZeroDuration();
    if (key == kProviderKey) {
      if (value.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "setting ", key,
            " is empty; name a libfabric provider, e.g. 'tcp;ofi_rxm' or "
            "'shm'"));
      }
      settings.provider = value;
      continue;
    }
    if (key == kAddressKey) {
      absl::StatusOr<std::string> address = resolve_address(value);
      if (!address.ok()) return address.status();
      settings.address = *std::move(address);
      settings.address_given = true;
      continue;
    }
    if (key == kRendezvousKey) {
      if (value == "auto") {
        settings.rendezvous = RendezvousMode::kAuto;
      } else if (value == "read") {
        settings.rendezvous = RendezvousMode::kRead;
      } else if (value == "tagged") {
        settings.rendezvous = RendezvousMode::kTagged;
      } else {
        return common::bad_value(key, value, "one of auto, read, tagged");
      }
      continue;
    }
    if (key == kThresholdKey) {
      number = parse_int(key, value, kMinThreshold, kMaxThreshold);
      if (number.ok()) {
        settings.rendezvous_threshold = *number;
        settings.threshold_given = true;
      }
    } else if (key == kCreditsKey) {
      number = parse_int(key, value, 1, kMaxCredits);
      if (number.ok()) settings.credits = static_cast<uint32_t>(*number);
    } else if (key == kPeerTimeoutKey) {
      duration = parse_milliseconds(key, value, 100, kDayMs);
      if (duration.ok()) settings.peer_timeout = *duration;
    } else if (key == kInitTimeoutKey) {
      duration = parse_milliseconds(key, value, 1, kDayMs);
      if (duration.ok()) settings.init_timeout = *duration;
    } else if (key == kAcceptTimeoutKey) {
      duration = parse_milliseconds(key, value, 100, kDayMs);
      if (duration.ok()) settings.accept_timeout = *duration;
    } else if (key == kCacheEntriesKey) {
      number = parse_int(key, value, 0, 1 << 20);
      if (number.ok()) settings.mr_cache_entries = static_cast<size_t>(*number);
    } else if (key == kCacheBytesKey) {
      number = parse_int(key, value, 0, int64_t{1} << 50);
      if (number.ok()) settings.mr_cache_bytes = static_cast<uint64_t>(*number);
    } else if (key == kSpinKey) {
      number = parse_int(key, value, 0, 1000000);
      if (number.ok()) settings.spin = absl::Microseconds(*number);
    } else {
      return common::unknown_setting(
          key, "libfabric",
          {kProviderKey, kAddressKey, kThresholdKey, kRendezvousKey,
           kCreditsKey, kPeerTimeoutKey, kInitTimeoutKey, kAcceptTimeoutKey,
           kCacheEntriesKey, kCacheBytesKey, kSpinKey});
    }
    if (!number.ok()) return number.status();
    if (!duration.ok()) return duration.status();
  }
  return settings;
}

}  // namespace tether::backends::libfabric::internal
