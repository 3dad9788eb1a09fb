#include "backends/tensorpipe/internal/tcp_transport.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <tensorpipe/transport/context_boilerplate.h>

#include <memory>
#include <string>
#include <utility>

#include "backends/tensorpipe/internal/tcp_transport_connection.h"
#include "backends/tensorpipe/internal/tcp_transport_context.h"
#include "backends/tensorpipe/internal/tcp_transport_listener.h"

namespace tether::backends::tensorpipe::internal {

bool parse_socket_address(const std::string& text, sockaddr_storage* storage,
                          socklen_t* length) {
  std::string host = text;
  std::string port_text;
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    std::string rest = host.substr(close + 1);
    host = host.substr(1, close - 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return false;
      port_text = rest.substr(1);
    }
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    port_text = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  int port = 0;
  if (!port_text.empty() &&
      (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535)) {
    return false;
  }
  *storage = sockaddr_storage{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in);
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

namespace tcp {

std::string format_address(const sockaddr_storage& storage) {
  char host[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(storage);
    inet_ntop(AF_INET, &v4.sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(v4.sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(storage);
    inet_ntop(AF_INET6, &v6.sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(v6.sin6_port));
  }
  return "?";
}

}  // namespace tcp

std::shared_ptr<::tensorpipe::transport::Context> create_tcp_transport(
    TcpTransportOptions options) {
  return std::make_shared<::tensorpipe::transport::ContextBoilerplate<
      tcp::ContextImpl, tcp::ListenerImpl, tcp::ConnectionImpl>>(
      std::move(options));
}

}  // namespace tether::backends::tensorpipe::internal
