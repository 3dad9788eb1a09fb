#include "core/host_address.h"

#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace tether {
namespace {

constexpr char kLoopback[] = "127.0.0.1";

// An address as text: IPv4 as is, IPv6 in brackets; "" if not IP.
std::string address_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) return text;
  } else if (address->sa_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(address);
    if (::inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text))) {
      return absl::StrCat("[", text, "]");
    }
  }
  return "";
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(address);
    return IN6_IS_ADDR_LOOPBACK(&in->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&in->sin6_addr) && in->sin6_addr.s6_addr[12] == 127);
  }
  return false;
}

// The first of the variables of rule 1 that is set and not empty, with its
// name; {"", ""} if none.
std::pair<std::string, std::string> ifname_from_environment() {
  for (const char* variable :
       {kSocketIfnameVariable, kTensorPipeSocketIfnameVariable}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && value[0] != '\0') return {variable, value};
  }
  return {"", ""};
}

// The source address of the route to `host` and whether `host` is on this
// machine's loopback; UNAVAILABLE as route_source_address().
absl::StatusOr<std::pair<std::string, bool>> route_to(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  // The port only makes connect() valid; nothing is sent to it.
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  std::string why = "no address";
  std::pair<std::string, bool> result;
  for (addrinfo* entry = found; entry != nullptr && result.first.empty();
       entry = entry->ai_next) {
    if (is_loopback(entry->ai_addr)) {
      result = {kLoopback, true};
      break;
    }
    const int fd =
        ::socket(entry->ai_family, entry->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::connect(fd, entry->ai_addr, entry->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) ==
            0) {
      result = {address_text(reinterpret_cast<sockaddr*>(&local)),
                is_loopback(reinterpret_cast<sockaddr*>(&local))};
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (result.first.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no route to '", host, "': ", why));
  }
  return result;
}

}  // namespace

absl::StatusOr<std::string> interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    return absl::NotFoundError(std::strerror(errno));
  }
  std::string v4;
  std::string v6;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || name != entry->ifa_name) continue;
    if (entry->ifa_addr->sa_family == AF_INET && v4.empty()) {
      v4 = address_text(entry->ifa_addr);
    } else if (entry->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      auto* in = reinterpret_cast<sockaddr_in6*>(entry->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in->sin6_addr)) continue;  // needs a scope
      v6 = address_text(entry->ifa_addr);
    }
  }
  ::freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError("no such interface, or no address on it");
}

absl::StatusOr<std::string> route_source_address(const std::string& host) {
  absl::StatusOr<std::pair<std::string, bool>> route = route_to(host);
  if (!route.ok()) return route.status();
  return route->first;
}

absl::StatusOr<HostAddressChoice> choose_host_address(
    absl::string_view rendezvous_host) {
  const auto [variable, ifname] = ifname_from_environment();
  if (!ifname.empty()) {
    absl::StatusOr<std::string> address = interface_address(ifname);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          variable, "='", ifname, "' names no usable network interface (",
          address.status().message(), ")"));
    }
    return HostAddressChoice{*address, absl::StrCat("interface ", ifname,
                                                    " (", variable, ")")};
  }
  if (rendezvous_host.empty()) {
    return HostAddressChoice{kLoopback, "the rendezvous has no host"};
  }
  absl::StatusOr<std::pair<std::string, bool>> route =
      route_to(std::string(rendezvous_host));
  if (!route.ok()) {
    return HostAddressChoice{
        kLoopback, absl::StrCat("no route to the rendezvous host: ",
                                route.status().message())};
  }
  if (route->second) {
    return HostAddressChoice{
        kLoopback,
        absl::StrCat("the rendezvous host ", rendezvous_host, " is loopback")};
  }
  return HostAddressChoice{
      route->first,
      absl::StrCat("the route to the rendezvous host ", rendezvous_host)};
}

absl::StatusOr<std::string> default_host_address(
    absl::string_view rendezvous_host) {
  absl::StatusOr<HostAddressChoice> choice =
      choose_host_address(rendezvous_host);
  if (!choice.ok()) return choice.status();
  return choice->address;
}

}  // namespace tether
