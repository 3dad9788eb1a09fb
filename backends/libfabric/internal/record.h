// The address record of a libfabric agent (internal to the libfabric
// backend): what a worker publishes in its group's store under
// "tether/libfabric/<rank>" for its peers, and how a peer reads it back.
// Used at creation and when a worker joins a dynamic group.
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_RECORD_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_RECORD_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <cstdint>
#include <optional>
#include <string>

#include "backends/libfabric/internal/settings.h"
#include "core/agent.h"

namespace tether::backends::libfabric::internal {

// What a worker publishes in the store for its peers.
struct Record {
  std::string provider;
  std::string address;  // the endpoint's name, raw
  uint64_t buffer_size = 0;
  uint32_t credits = 0;
  RendezvousMode mode = RendezvousMode::kRead;  // read or tagged
  int64_t pid = 0;
  // Equal values mean pids and abstract sockets can be shared (see
  // host_identity()).
  std::string host;
  // Where same-host peers ring to wake a polling progress thread: an
  // abstract Unix socket name, raw (empty: none).
  std::string doorbell;
  // The worker's name (dynamic groups: a member learns a joiner's name
  // from it when the joiner's first frame comes before MEMBER_JOIN).
  std::string name;
};

std::string encode_record(const Record& record);

// INVALID_ARGUMENT naming the first bad field, or when a required one is
// missing; fields of a later version are skipped.
[[nodiscard]] absl::StatusOr<Record> decode_record(absl::string_view text);

// Where the worker of `record` listens, for Agent::endpoint_of (Paddle's
// WorkerInfo.ip/.port): the providers that name an endpoint by a socket
// address (tcp;ofi_rxm, tcp, sockets, udp, and rxm/rxd over them) publish
// a sockaddr_in or sockaddr_in6. nullopt for the others (shm names a
// path). UNAVAILABLE, naming the provider, when such a name is not one.
[[nodiscard]] absl::StatusOr<std::optional<Endpoint>> endpoint_in_record(
    const Record& record);

// The boot id and the pid and network namespaces: peers with the same
// identity can see each other's pids and abstract Unix sockets.
std::string host_identity();

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_RECORD_H_
