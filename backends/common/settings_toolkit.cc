#include "backends/common/settings_toolkit.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "core/host_address.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tether::backends::common {

absl::Status bad_value(absl::string_view key, absl::string_view value,
                       absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("setting ", key, ": '", value, "' is not ", expected));
}

absl::StatusOr<int64_t> parse_int(absl::string_view key,
                                  absl::string_view value, int64_t min,
                                  int64_t max) {
  int64_t number = 0;
  if (!absl::SimpleAtoi(value, &number) || number < min || number > max) {
    return bad_value(key, value,
                     absl::StrCat("an integer in [", min, ", ", max, "]"));
  }
  return number;
}

absl::StatusOr<absl::Duration> parse_milliseconds(absl::string_view key,
                                                  absl::string_view value,
                                                  int64_t min_ms,
                                                  int64_t max_ms) {
  absl::StatusOr<int64_t> ms = parse_int(key, value, min_ms, max_ms);
  if (!ms.ok()) return ms.status();
  return absl::Milliseconds(*ms);
}

absl::StatusOr<bool> parse_switch(absl::string_view key,
                                  absl::string_view value) {
  const std::string lower = absl::AsciiStrToLower(value);
  if (lower == "on" || lower == "true" || lower == "1") return true;
  if (lower == "off" || lower == "false" || lower == "0") return false;
  return bad_value(key, value, "on or off");
}

absl::StatusOr<std::vector<std::string>> parse_list(
    absl::string_view key, absl::string_view value,
    const std::vector<std::string>& known) {
  std::vector<std::string> names;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    std::string name(absl::StripAsciiWhitespace(part));
    if (name.empty()) continue;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("setting ", key, ": unknown name '", name,
                       "'; known: ", absl::StrJoin(known, ", ")));
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  if (names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting ", key,
                     " names nothing; known: ", absl::StrJoin(known, ", ")));
  }
  return names;
}

absl::StatusOr<std::string> resolve_host(absl::string_view key,
                                         const std::string& value) {
  in_addr v4;
  in6_addr v6;
  if (::inet_pton(AF_INET, value.c_str(), &v4) == 1) return value;
  if (::inet_pton(AF_INET6, value.c_str(), &v6) == 1) {
    return absl::StrCat("[", value, "]");
  }
  absl::StatusOr<std::string> address = interface_address(value);
  if (!address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "setting ", key, ": '", value,
        "' is neither an IP address nor a usable network interface (",
        address.status().message(), ")"));
  }
  return address;
}

absl::Status unknown_setting(absl::string_view key, absl::string_view backend,
                             absl::Span<const absl::string_view> known) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown setting '", key, "'; the ", backend,
                   " backend knows ", absl::StrJoin(known, ", ")));
}

}  // namespace tether::backends::common
