#include "backends/libfabric/internal/settings.h"

#include <absl/status/status.h>
#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include "backends/common/settings_toolkit.h"

namespace tether::backends::libfabric::internal {
namespace {

using common::int_into;
using common::ms_into;
using common::parse_int;
using common::us_into;

constexpr char kAddressKey[] = "libfabric.address";

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
  static const auto* const kTable = new common::SettingsTable<Settings>(
      "libfabric",
      {
          {"libfabric.provider",
           [](absl::string_view key, const std::string& value,
              Settings& settings) -> absl::Status {
             if (value.empty()) {
               return absl::InvalidArgumentError(
                   absl::StrCat("setting ", key,
                                " is empty; name a libfabric provider, e.g. "
                                "'tcp;ofi_rxm' or 'shm'"));
             }
             settings.provider = value;
             return absl::OkStatus();
           }},
          {kAddressKey,
           [](absl::string_view, const std::string& value,
              Settings& settings) -> absl::Status {
             absl::StatusOr<std::string> address = resolve_address(value);
             if (!address.ok()) return address.status();
             settings.address = *std::move(address);
             settings.address_given = true;
             return absl::OkStatus();
           }},
          {"libfabric.rendezvous_threshold",
           [](absl::string_view key, const std::string& value,
              Settings& settings) -> absl::Status {
             absl::StatusOr<int64_t> threshold =
                 parse_int(key, value, kMinThreshold, kMaxThreshold);
             if (!threshold.ok()) return threshold.status();
             settings.rendezvous_threshold = *threshold;
             settings.threshold_given = true;
             return absl::OkStatus();
           }},
          {"libfabric.rendezvous",
           [](absl::string_view key, const std::string& value,
              Settings& settings) -> absl::Status {
             for (RendezvousMode mode :
                  {RendezvousMode::kAuto, RendezvousMode::kRead,
                   RendezvousMode::kTagged}) {
               if (value == rendezvous_mode_name(mode)) {
                 settings.rendezvous = mode;
                 return absl::OkStatus();
               }
             }
             return common::bad_value(key, value, "one of auto, read, tagged");
           }},
          {"libfabric.credits", int_into(&Settings::credits, 1, kMaxCredits)},
          {"libfabric.peer_timeout_ms",
           ms_into(&Settings::peer_timeout, 100, kDayMs)},
          {"libfabric.init_timeout_ms",
           ms_into(&Settings::init_timeout, 1, kDayMs)},
          {"libfabric.accept_timeout_ms",
           ms_into(&Settings::accept_timeout, 100, kDayMs)},
          {"libfabric.mr_cache_entries",
           int_into(&Settings::mr_cache_entries, 0, 1 << 20)},
          {"libfabric.mr_cache_bytes",
           int_into(&Settings::mr_cache_bytes, 0, int64_t{1} << 50)},
          {"libfabric.spin_us", us_into(&Settings::spin, 0, 1000000)},
      });
  // Values are read without the white space around them.
  absl::flat_hash_map<std::string, std::string> stripped;
  for (const auto& [key, value] : raw) {
    stripped.emplace(key, absl::StripAsciiWhitespace(value));
  }
  Settings settings;
  if (absl::Status read = kTable->read(stripped, settings); !read.ok()) {
    return read;
  }
  return settings;
}

}  // namespace tether::backends::libfabric::internal
