#include "backends/libfabric/internal/settings.h"

#include <absl/status/status.h>
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <vector>

namespace tether::backends::libfabric::internal {
namespace {

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

// An integer in [low, high], or INVALID_ARGUMENT naming `key`.
absl::StatusOr<int64_t> parse_int(const std::string& key,
                                  const std::string& value, int64_t low,
                                  int64_t high) {
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < low || parsed > high) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting ", key, ": '", value,
                     "' is not an integer in [", low, ", ", high, "]"));
  }
  return parsed;
}

// An IP literal as is, a network interface's first address (IPv4 first),
// "" as is; otherwise INVALID_ARGUMENT naming the key.
absl::StatusOr<std::string> resolve_address(const std::string& value) {
  in_addr v4;
  in6_addr v6;
  if (value.empty() || inet_pton(AF_INET, value.c_str(), &v4) == 1 ||
      inet_pton(AF_INET6, value.c_str(), &v6) == 1) {
    return value;
  }
  ifaddrs* interfaces = nullptr;
  std::string found;
  if (getifaddrs(&interfaces) == 0) {
    for (int family : {AF_INET, AF_INET6}) {
      for (ifaddrs* entry = interfaces; entry != nullptr && found.empty();
           entry = entry->ifa_next) {
        if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != family ||
            value != entry->ifa_name) {
          continue;
        }
        char text[INET6_ADDRSTRLEN] = {0};
        const void* raw =
            family == AF_INET
                ? static_cast<const void*>(
                      &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr)
                : static_cast<const void*>(
                      &reinterpret_cast<sockaddr_in6*>(entry->ifa_addr)
                           ->sin6_addr);
        if (inet_ntop(family, raw, text, sizeof(text)) != nullptr) found = text;
      }
    }
    freeifaddrs(interfaces);
  }
  if (found.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "setting ", kAddressKey, ": '", value,
        "' is neither an IP address nor a network interface of this machine "
        "with an address"));
  }
  return found;
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
    absl::StatusOr<int64_t> number;
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
        return absl::InvalidArgumentError(
            absl::StrCat("setting ", key, ": '", value,
                         "' is none of auto, read, tagged"));
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
      number = parse_int(key, value, 100, int64_t{24} * 3600 * 1000);
      if (number.ok()) settings.peer_timeout = absl::Milliseconds(*number);
    } else if (key == kInitTimeoutKey) {
      number = parse_int(key, value, 1, int64_t{24} * 3600 * 1000);
      if (number.ok()) settings.init_timeout = absl::Milliseconds(*number);
    } else if (key == kAcceptTimeoutKey) {
      number = parse_int(key, value, 100, int64_t{24} * 3600 * 1000);
      if (number.ok()) settings.accept_timeout = absl::Milliseconds(*number);
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
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown setting '", key, "'; the libfabric backend knows ",
          absl::StrJoin(std::vector<const char*>{kProviderKey, kAddressKey,
                                                 kThresholdKey, kRendezvousKey,
                                                 kCreditsKey, kPeerTimeoutKey,
                                                 kInitTimeoutKey,
                                                 kAcceptTimeoutKey,
                                                 kCacheEntriesKey,
                                                 kCacheBytesKey, kSpinKey},
                        ", ")));
    }
    if (!number.ok()) return number.status();
  }
  return settings;
}

}  // namespace tether::backends::libfabric::internal
