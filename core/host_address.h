// The address a worker listens on and publishes for its peers when its
// backend's own address setting is not given: chosen here once, for every
// backend (backends/common/agent_skeleton.h's create_agent() asks for it).
//
// The rule, first that applies (docs/architecture.md section 9):
//   1. TETHER_SOCKET_IFNAME names a network interface: its address (its
//      first IPv4 one, else its first IPv6 one that is not link-local).
//      TP_SOCKET_IFNAME, the variable the peer's TensorPipe agent reads, is
//      read when TETHER_SOCKET_IFNAME is not set. An interface that does
//      not exist, or has no address, is INVALID_ARGUMENT naming the
//      variable: the user asked for it, and a guess would hide the typo.
//   2. The rendezvous has a host (MASTER_ADDR for env://, HOST of
//      tcp://HOST:PORT) that is not loopback: the address of the interface
//      this machine reaches that host through, as the kernel's routing
//      table says (a UDP socket connect()ed to it, then getsockname(); no
//      packet is sent). The store was reached over that route, so the
//      peers, which reached it too, can most likely reach this address.
//   3. Otherwise (a loopback rendezvous host, file://, memory://, or a
//      host that resolves to no route): 127.0.0.1, as before.
//
// Not the hostname's address: in many containers the hostname resolves to
// 127.0.0.1, which a worker on another host cannot reach.
//
// Used by backends/common (the skeleton's create_agent) and by tests.
//
// Thread safety: the functions read the environment and the interfaces;
// they keep no state and may be called from any thread.
#ifndef TETHER_CORE_HOST_ADDRESS_H_
#define TETHER_CORE_HOST_ADDRESS_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <string>

namespace tether {

// The variables of rule 1, in the order they are read.
inline constexpr char kSocketIfnameVariable[] = "TETHER_SOCKET_IFNAME";
inline constexpr char kTensorPipeSocketIfnameVariable[] = "TP_SOCKET_IFNAME";

// The address to listen on and publish: an IPv4 literal, or an IPv6 one in
// brackets. `rendezvous_host` is RendezvousResult::host ("" when the
// rendezvous has none). INVALID_ARGUMENT for rule 1's bad interface.
[[nodiscard]] absl::StatusOr<std::string> default_host_address(
    absl::string_view rendezvous_host);

// Why default_host_address() chose what it chose, for a log line
// ("interface eth0 (TETHER_SOCKET_IFNAME)", "the route to 10.0.0.1", ...).
struct HostAddressChoice {
  std::string address;
  std::string reason;
};
[[nodiscard]] absl::StatusOr<HostAddressChoice> choose_host_address(
    absl::string_view rendezvous_host);

// The first IPv4 address of network interface `name`, else its first
// non-link-local IPv6 one (in brackets); NOT_FOUND if it has none.
[[nodiscard]] absl::StatusOr<std::string> interface_address(
    const std::string& name);

// The local address of the route to `host` (a name or an IP literal): a
// UDP socket connect()ed there, then getsockname(); nothing is sent.
// UNAVAILABLE when the name does not resolve or no route leads there.
[[nodiscard]] absl::StatusOr<std::string> route_source_address(
    const std::string& host);

}  // namespace tether

#endif  // TETHER_CORE_HOST_ADDRESS_H_
