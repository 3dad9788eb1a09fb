// The settings toolkit: how a backend reads its "<backend>.*" keys of
// AgentSetup::settings, in one wording for every backend: integers in
// range, durations in milliseconds, switches, lists of known names, a host
// given as an IP literal or a network interface, and the error for a key
// the backend does not know.
//
// Used by backends/tensorpipe, backends/grpc and backends/faulty (libfabric
// later).
// Every error is INVALID_ARGUMENT and names the key and the value.
//
// Thread safety: the functions are pure (interface_address reads the
// system's interface list).
#ifndef TETHER_BACKENDS_COMMON_SETTINGS_TOOLKIT_H_
#define TETHER_BACKENDS_COMMON_SETTINGS_TOOLKIT_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace tether::backends::common {

// "setting <key>: '<value>' is not <expected>".
absl::Status bad_value(absl::string_view key, absl::string_view value,
                       absl::string_view expected);

// An integer in [min, max].
[[nodiscard]] absl::StatusOr<int64_t> parse_int(absl::string_view key,
                                                absl::string_view value,
                                                int64_t min, int64_t max);

// A duration given in whole milliseconds, in [min_ms, max_ms].
[[nodiscard]] absl::StatusOr<absl::Duration> parse_milliseconds(
    absl::string_view key, absl::string_view value, int64_t min_ms,
    int64_t max_ms = int64_t{1} << 31);

// on/true/1 or off/false/0, in any case.
[[nodiscard]] absl::StatusOr<bool> parse_switch(absl::string_view key,
                                                absl::string_view value);

// A comma-separated list of names out of `known`, duplicates dropped, in
// the given order; at least one.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> parse_list(
    absl::string_view key, absl::string_view value,
    const std::vector<std::string>& known);

// The first IPv4 address of network interface `name`, else its first
// non-link-local IPv6 one (in brackets); NOT_FOUND if it has none.
[[nodiscard]] absl::StatusOr<std::string> interface_address(
    const std::string& name);

// An IP literal as is (IPv6 in brackets), or the address of the network
// interface `value` names.
[[nodiscard]] absl::StatusOr<std::string> resolve_host(
    absl::string_view key, const std::string& value);

// "unknown setting '<key>'; the <backend> backend knows <known...>".
absl::Status unknown_setting(absl::string_view key, absl::string_view backend,
                             std::initializer_list<absl::string_view> known);

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_SETTINGS_TOOLKIT_H_
