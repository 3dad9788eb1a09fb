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

namespace tether::backends::grpc::internal {
namespace {

// The keys named outside the table too.
constexpr char kAddressKey[] = "grpc.address";
constexpr char kTlsCertKey[] = "grpc.tls_cert";
constexpr char kTlsKeyKey[] = "grpc.tls_key";
constexpr char kTlsCaKey[] = "grpc.tls_ca";
constexpr char kTlsServerNameKey[] = "grpc.tls_server_name";

constexpr int kMaxCompletionThreads = 64;
constexpr uint64_t kMinChunk = 4 << 10;
constexpr uint64_t kMaxChunk = 64 << 20;

using common::bad_value;
using common::int_into;
using common::ms_into;
using common::parse_int;
using common::parse_switch;
using common::text_into;

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

// What the table reads into: the settings, and the paths of the TLS files
// (read once every key is in, as they go together).
struct Reading : Settings {
  std::string cert_path;
  std::string key_path;
  std::string ca_path;
};

const common::SettingsTable<Reading>& settings_table() {
  static const auto* const kTable = new common::SettingsTable<Reading>(
      "grpc",
      {
          {kAddressKey,
           [](absl::string_view, const std::string& value, Reading& reading) {
             return parse_address(value, reading);
           }},
          {kTlsCertKey, text_into(&Reading::cert_path)},
          {kTlsKeyKey, text_into(&Reading::key_path)},
          {kTlsCaKey, text_into(&Reading::ca_path)},
          {"grpc.tls_mutual",
           [](absl::string_view key, const std::string& value,
              Reading& reading) -> absl::Status {
             absl::StatusOr<bool> on = parse_switch(key, value);
             if (!on.ok()) return on.status();
             reading.tls.mutual = *on;
             return absl::OkStatus();
           }},
          {kTlsServerNameKey,
           [](absl::string_view key, const std::string& value,
              Reading& reading) -> absl::Status {
             if (value.empty()) return bad_value(key, value, "a host name");
             reading.tls.server_name = value;
             return absl::OkStatus();
           }},
          {"grpc.keepalive_ms", ms_into(&Settings::keepalive, 0)},
          {"grpc.keepalive_timeout_ms",
           ms_into(&Settings::keepalive_timeout, 1)},
          {"grpc.completion_threads",
           int_into(&Settings::completion_threads, 1, kMaxCompletionThreads)},
          {"grpc.max_message_bytes",
           int_into(&Settings::max_message_bytes, 1, kMaxMessageLimit)},
          {"grpc.chunk_bytes",
           int_into(&Settings::chunk_bytes, kMinChunk, kMaxChunk)},
          {"grpc.init_timeout_ms", ms_into(&Settings::init_timeout, 1)},
          {"grpc.auth_timeout_ms", ms_into(&Settings::auth_timeout, 1)},
      });
  return *kTable;
}

}  // namespace

absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw) {
  Reading reading;
  if (absl::Status read = settings_table().read(raw, reading); !read.ok()) {
    return read;
  }
  const bool any_tls = !reading.cert_path.empty() ||
                       !reading.key_path.empty() || !reading.ca_path.empty();
  if (any_tls) {
    // Each worker is a server and a client: one identity serves both.
    for (const auto& [key, path] : {std::pair<const char*, const std::string&>{
                                        kTlsCertKey, reading.cert_path},
                                    {kTlsKeyKey, reading.key_path},
                                    {kTlsCaKey, reading.ca_path}}) {
      if (path.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "setting ", key, " is missing: TLS needs ", kTlsCertKey, ", ",
            kTlsKeyKey, " and ", kTlsCaKey, " together"));
      }
    }
    absl::StatusOr<std::string> cert =
        read_file(kTlsCertKey, reading.cert_path);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = read_file(kTlsKeyKey, reading.key_path);
    if (!key.ok()) return key.status();
    absl::StatusOr<std::string> ca = read_file(kTlsCaKey, reading.ca_path);
    if (!ca.ok()) return ca.status();
    reading.tls.cert_chain = *std::move(cert);
    reading.tls.private_key = *std::move(key);
    reading.tls.root_certs = *std::move(ca);
  } else if (raw.contains(kTlsServerNameKey)) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting ", kTlsServerNameKey, " without TLS (set ",
                     kTlsCertKey, ", ", kTlsKeyKey, " and ", kTlsCaKey, ")"));
  }
  return static_cast<Settings>(std::move(reading));
}

}  // namespace tether::backends::grpc::internal
