#include "backends/grpc/internal/settings.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace tether::backends::grpc_internal {
namespace {

constexpr char kAddressKey[] = "grpc.address";
constexpr char kTlsCertKey[] = "grpc.tls_cert";
constexpr char kTlsKeyKey[] = "grpc.tls_key";
constexpr char kTlsCaKey[] = "grpc.tls_ca";
constexpr char kTlsMutualKey[] = "grpc.tls_mutual";
constexpr char kTlsServerNameKey[] = "grpc.tls_server_name";
constexpr char kKeepaliveKey[] = "grpc.keepalive_ms";
constexpr char kKeepaliveTimeoutKey[] = "grpc.keepalive_timeout_ms";
constexpr char kCompletionThreadsKey[] = "grpc.completion_threads";
constexpr char kMaxMessageKey[] = "grpc.max_message_bytes";
constexpr char kChunkKey[] = "grpc.chunk_bytes";
constexpr char kInitTimeoutKey[] = "grpc.init_timeout_ms";
constexpr char kAuthTimeoutKey[] = "grpc.auth_timeout_ms";

constexpr int kMaxCompletionThreads = 64;
constexpr uint64_t kMinChunk = 4 << 10;
constexpr uint64_t kMaxChunk = 64 << 20;

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

absl::StatusOr<bool> parse_switch(absl::string_view key,
                                  absl::string_view value) {
  const std::string lower = absl::AsciiStrToLower(value);
  if (lower == "on" || lower == "true" || lower == "1") return true;
  if (lower == "off" || lower == "false" || lower == "0") return false;
  return bad_value(key, value, "on or off");
}

absl::StatusOr<std::string> read_file(absl::string_view key,
                                      const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "setting ", key, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting ", key, ": '", path, "' holds no PEM block"));
  }
  return text.str();
}

// The first IPv4 address of network interface `name`, else its first IPv6
// one (in brackets); NOT_FOUND if it has none.
absl::StatusOr<std::string> interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    return absl::NotFoundError(std::strerror(errno));
  }
  std::string v4;
  std::string v6;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || name != entry->ifa_name) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (entry->ifa_addr->sa_family == AF_INET && v4.empty()) {
      auto* in = reinterpret_cast<sockaddr_in*>(entry->ifa_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) v4 = text;
    } else if (entry->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      auto* in = reinterpret_cast<sockaddr_in6*>(entry->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in->sin6_addr)) continue;  // needs a scope
      if (::inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text))) {
        v6 = absl::StrCat("[", text, "]");
      }
    }
  }
  ::freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError("no such interface, or no address on it");
}

// "IP", "IP:port", "[IPv6]", "[IPv6]:port", "interface" or
// "interface:port", into `settings`.
absl::Status parse_address(const std::string& value, Settings& settings) {
  std::string host = value;
  std::string port_text;
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) {
      return bad_value(kAddressKey, value, "an address (unbalanced brackets)");
    }
    std::string rest = host.substr(close + 1);
    host = host.substr(1, close - 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return bad_value(kAddressKey, value, "an address");
      port_text = rest.substr(1);
    }
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    const size_t colon = host.find(':');
    port_text = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (!port_text.empty()) {
    absl::StatusOr<int64_t> port = parse_int(kAddressKey, port_text, 0, 65535);
    if (!port.ok()) return port.status();
    settings.port = static_cast<int>(*port);
  }
  in_addr v4;
  in6_addr v6;
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    if (v4.s_addr == htonl(INADDR_ANY)) {
      return bad_value(kAddressKey, value,
                       "an address peers can reach (0.0.0.0 is not)");
    }
    settings.host = host;
    return absl::OkStatus();
  }
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_UNSPECIFIED(&v6)) {
      return bad_value(kAddressKey, value,
                       "an address peers can reach (:: is not)");
    }
    settings.host = absl::StrCat("[", host, "]");
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> address = interface_address(host);
  if (!address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "setting ", kAddressKey, ": '", value,
        "' is neither an IP address nor a usable network interface (",
        address.status().message(), ")"));
  }
  settings.host = *std::move(address);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw) {
  Settings settings;
  std::string cert_path;
  std::string key_path;
  std::string ca_path;
  for (const auto& [key, value] : raw) {
    if (!absl::StartsWith(key, "grpc.")) continue;  // another backend's
    if (key == kAddressKey) {
      if (absl::Status parsed = parse_address(value, settings); !parsed.ok()) {
        return parsed;
      }
    } else if (key == kTlsCertKey) {
      cert_path = value;
    } else if (key == kTlsKeyKey) {
      key_path = value;
    } else if (key == kTlsCaKey) {
      ca_path = value;
    } else if (key == kTlsMutualKey) {
      absl::StatusOr<bool> on = parse_switch(key, value);
      if (!on.ok()) return on.status();
      settings.tls.mutual = *on;
    } else if (key == kTlsServerNameKey) {
      if (value.empty()) return bad_value(key, value, "a host name");
      settings.tls.server_name = value;
    } else if (key == kKeepaliveKey || key == kKeepaliveTimeoutKey ||
               key == kInitTimeoutKey || key == kAuthTimeoutKey) {
      const int64_t min = key == kKeepaliveKey ? 0 : 1;
      absl::StatusOr<int64_t> ms = parse_int(key, value, min, int64_t{1} << 31);
      if (!ms.ok()) return ms.status();
      absl::Duration& target = key == kKeepaliveKey ? settings.keepalive
                               : key == kKeepaliveTimeoutKey
                                   ? settings.keepalive_timeout
                                   : key == kInitTimeoutKey
                                       ? settings.init_timeout
                                       : settings.auth_timeout;
      target = absl::Milliseconds(*ms);
    } else if (key == kCompletionThreadsKey) {
      absl::StatusOr<int64_t> threads =
          parse_int(key, value, 1, kMaxCompletionThreads);
      if (!threads.ok()) return threads.status();
      settings.completion_threads = static_cast<int>(*threads);
    } else if (key == kMaxMessageKey) {
      absl::StatusOr<int64_t> bytes = parse_int(key, value, 1, kMaxMessageLimit);
      if (!bytes.ok()) return bytes.status();
      settings.max_message_bytes = static_cast<uint64_t>(*bytes);
    } else if (key == kChunkKey) {
      absl::StatusOr<int64_t> bytes =
          parse_int(key, value, kMinChunk, kMaxChunk);
      if (!bytes.ok()) return bytes.status();
      settings.chunk_bytes = static_cast<uint64_t>(*bytes);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown setting '", key, "'; the grpc backend knows ",
          absl::StrJoin({kAddressKey, kTlsCertKey, kTlsKeyKey, kTlsCaKey,
                         kTlsMutualKey, kTlsServerNameKey, kKeepaliveKey,
                         kKeepaliveTimeoutKey, kCompletionThreadsKey,
                         kMaxMessageKey, kChunkKey, kInitTimeoutKey,
                         kAuthTimeoutKey},
                        ", ")));
    }
  }
  const bool any_tls =
      !cert_path.empty() || !key_path.empty() || !ca_path.empty();
  if (any_tls) {
    // Each worker is a server and a client: one identity serves both.
    for (const auto& [key, path] :
         {std::pair<const char*, const std::string&>{kTlsCertKey, cert_path},
          {kTlsKeyKey, key_path},
          {kTlsCaKey, ca_path}}) {
      if (path.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "setting ", key, " is missing: TLS needs ", kTlsCertKey, ", ",
            kTlsKeyKey, " and ", kTlsCaKey, " together"));
      }
    }
    absl::StatusOr<std::string> cert = read_file(kTlsCertKey, cert_path);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = read_file(kTlsKeyKey, key_path);
    if (!key.ok()) return key.status();
    absl::StatusOr<std::string> ca = read_file(kTlsCaKey, ca_path);
    if (!ca.ok()) return ca.status();
    settings.tls.cert_chain = *std::move(cert);
    settings.tls.private_key = *std::move(key);
    settings.tls.root_certs = *std::move(ca);
  } else if (raw.contains(kTlsServerNameKey)) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting ", kTlsServerNameKey, " without TLS (set ",
                     kTlsCertKey, ", ", kTlsKeyKey, " and ", kTlsCaKey, ")"));
  }
  return settings;
}

}  // namespace tether::backends::grpc_internal
