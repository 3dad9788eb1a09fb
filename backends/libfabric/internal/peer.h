// What a libfabric agent knows of one worker of its group (internal to the
// libfabric backend): its address and record, the credits and control slot
// of eager frames either way (docs/libfabric.md, flow control), what waits
// on it, its liveness, its membership and its authentication state.
//
// Thread safety: none; the agent's progress thread alone uses it (and its
// creating thread before that thread runs).
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_PEER_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_PEER_H_

#include <absl/container/flat_hash_set.h>
#include <absl/status/status.h>
#include <absl/time/time.h>
#include <rdma/fabric.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "backends/libfabric/internal/operations.h"
#include "backends/libfabric/internal/settings.h"
#include "core/auth/handshake.h"
#include "core/message.h"

namespace tether::backends::libfabric::internal {

// What one agent knows of one worker of its group (itself included).
struct Peer {
  int rank = -1;
  std::string name;
  fi_addr_t address = FI_ADDR_NOTAVAIL;
  // From its record.
  uint64_t buffer_size = 0;
  uint32_t granted = 0;  // credits it grants us
  RendezvousMode mode = RendezvousMode::kRead;
  int64_t pid = 0;
  bool same_host = false;
  // Its doorbell (same host only; length 0: none).
  sockaddr_un doorbell{};
  socklen_t doorbell_length = 0;

  // Sending to it.
  uint32_t credits = 0;
  bool control_slot_free = true;
  std::deque<OutFrame> queue;
  bool queued_listed = false;
  // Receiving from it: credits and the control slot we owe it.
  uint32_t owed = 0;
  bool control_slot_owed = false;
  bool credit_listed = false;

  // Our requests awaiting its response; our transfers it has not
  // released; its messages we are pulling.
  absl::flat_hash_set<int64_t> requests;
  absl::flat_hash_set<uint64_t> transfers;
  absl::flat_hash_set<std::shared_ptr<Arrival>> incoming;

  // Liveness.
  absl::Time last_heard = absl::InfinitePast();
  absl::Time expecting_since = absl::InfiniteFuture();
  absl::Time keepalive_sent = absl::InfinitePast();
  // The first keepalive of the current silence that our own progress
  // thread then had time to hear an answer to (see housekeeping()).
  absl::Time asked_at = absl::InfinitePast();
  bool ack_queued = false;
  // Frames went either way: it is told goodbye at shutdown.
  bool talked = false;
  // Why it is lost, while it is; `gone` once it said goodbye.
  std::optional<absl::Status> lost;
  bool gone = false;
  // Bumped when it is lost: requests sent later are on a new connection.
  uint32_t epoch = 0;
  // Dynamic groups: it left (Agent::remove_peer); its address is out of
  // the address vector and its slot waits for a worker joining with its
  // rank.
  bool left = false;
  // Dynamic groups: it is leaving (Agent::remove_peer): no new sends go to
  // it, what it still sends (its goodbye, answers) is taken, and it is
  // dropped on its goodbye or when a worker joins with its rank.
  bool leaving = false;
  // Its endpoint's name, as inserted.
  std::string raw_address;

  // Authentication (AgentSetup::auth; internal/framing.h has the envelope),
  // one core/auth Handshake per direction. Our requests to it wait in
  // auth_waiting until it has verified our proof and proved itself.
  enum class ClientAuth { kNone, kStarted, kReady };
  ClientAuth client_auth = ClientAuth::kNone;
  std::unique_ptr<auth::Handshake> client_handshake;
  std::deque<std::pair<int64_t, Message>> auth_waiting;
  // Its requests to us are accepted once it is kAuthenticated.
  enum class ServerAuth { kNone, kStarted, kAuthenticated };
  ServerAuth server_auth = ServerAuth::kNone;
  std::unique_ptr<auth::Handshake> server_handshake;
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_PEER_H_
