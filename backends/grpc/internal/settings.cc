#include "backends/grpc/internal/settings.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "backends/common/settings_toolkit.h"

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

using common::bad_value;
using common::parse_int;
using common::parse_switch;

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
  absl::StatusOr<std::string> address = common::resolve_host(kAddressKey, host);
  if (!address.ok()) return address.status();
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
      absl::StatusOr<absl::Duration> duration =
          common::parse_milliseconds(key, value, key == kKeepaliveKey ? 0 : 1);
      if (!duration.ok()) return duration.status();
      absl::Duration& target = key == kKeepaliveKey ? settings.keepalive
                               : key == kKeepaliveTimeoutKey
                                   ? settings.keepalive_timeout
                               : key == kInitTimeoutKey ? settings.init_timeout
                                                        : settings.auth_timeout;
      target = *duration;
    } else if (key == kCompletionThreadsKey) {
      absl::StatusOr<int64_t> threads =
          parse_int(key, value, 1, kMaxCompletionThreads);
      if (!threads.ok()) return threads.status();
      settings.completion_threads = static_cast<int>(*threads);
    } else if (key == kMaxMessageKey) {
      absl::StatusOr<int64_t> bytes =
          parse_int(key, value, 1, kMaxMessageLimit);
      if (!bytes.ok()) return bytes.status();
      settings.max_message_bytes = static_cast<uint64_t>(*bytes);
    } else if (key == kChunkKey) {
      absl::StatusOr<int64_t> bytes =
          parse_int(key, value, kMinChunk, kMaxChunk);
      if (!bytes.ok()) return bytes.status();
      settings.chunk_bytes = static_cast<uint64_t>(*bytes);
    } else {
      return common::unknown_setting(
          key, "grpc",
          {kAddressKey, kTlsCertKey, kTlsKeyKey, kTlsCaKey, kTlsMutualKey,
           kTlsServerNameKey, kKeepaliveKey, kKeepaliveTimeoutKey,
           kCompletionThreadsKey, kMaxMessageKey, kChunkKey, kInitTimeoutKey,
           kAuthTimeoutKey});
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
