// The libfabric backend: agents that talk through libfabric (OFI) reliable
// datagram endpoints (FI_EP_RDM), for RDMA-capable fabrics: small messages
// as eager tagged frames under credit flow control, large buffers pulled by
// rendezvous (RMA read or tagged). docs/libfabric.md has how it connects and
// carries messages, lost peers, authentication and limits;
// docs/security.md what a stranger can do to it.
//
// Providers (libfabric.provider): "tcp;ofi_rxm" (the default) and "shm"
// (processes of one host) run on any Linux machine; "verbs;ofi_rxm"
// (InfiniBand, RoCE) and "efa" (AWS) on RDMA hardware. viable() and create()
// report a provider absent here with FAILED_PRECONDITION, naming it and the
// providers that are available. Every worker of a group must use the same
// provider.
//
// Settings (AgentSetup::settings; an unknown "libfabric.*" key or a bad
// value is INVALID_ARGUMENT naming the key):
//   libfabric.provider        the provider, as libfabric names it
//                             (default "tcp;ofi_rxm")
//   libfabric.address         for IP providers: the IP address or network
//                             interface to bind (default: the address
//                             every backend chooses, core/host_address.h;
//                             a provider that cannot use the default picks
//                             its own); "" = the provider's choice
//   libfabric.rendezvous_threshold  payloads and storages of at least this
//                             many bytes go by rendezvous; it also sizes the
//                             eager buffers (threshold + 1 KiB), 256 B..64 MiB
//                             (default 16384, or the provider's inject size
//                             less 1 KiB where that is smaller and at least
//                             2 KiB: 3072 on shm)
//   libfabric.rendezvous      how this agent pulls large buffers: "auto"
//                             (fi_read where the provider has FI_RMA, else
//                             tagged), "read", "tagged" (default "auto")
//   libfabric.credits         eager buffers granted to each peer, 1..1024
//                             (default 16; fewer if the provider's receive
//                             queue cannot hold world size x (credits + 1))
//   libfabric.peer_timeout_ms silence after which a peer with work pending
//                             is lost, >= 100 (default 10000, or the
//                             peer timeout if that is longer)
//   libfabric.init_timeout_ms how long creation waits for every rank's
//                             address (default 60000)
//   libfabric.accept_timeout_ms  tcp providers: how long a connection to
//                             the endpoint's listener may take to make its
//                             connection request before it is reset, >= 100
//                             (default 5000; docs/security.md)
//   libfabric.mr_cache_entries, libfabric.mr_cache_bytes  bounds of the
//                             registration cache (default 64 entries,
//                             256 MiB; 0 entries: no cache)
//   libfabric.spin_us         how long the progress thread keeps polling
//                             after its last work before it sleeps (default
//                             RpcOptions::busy_poll, 0)
//
// Threads: one progress thread per agent drives the completion queue, runs
// the request handler and completes send() futures, plus one timer thread;
// a caller's thread may drive the queue itself while it waits for its
// answer (docs/libfabric.md, "Threads"). internal/agent_state.h maps the
// implementation, file by file.
#ifndef TETHER_BACKENDS_LIBFABRIC_LIBFABRIC_AGENT_H_
#define TETHER_BACKENDS_LIBFABRIC_LIBFABRIC_AGENT_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <string>

#include "core/agent.h"
#include "core/backend_registry.h"

namespace tether::backends {

// The backend named "libfabric", for a BackendRegistry. `defaults` are
// settings its agents use where AgentSetup::settings has no value, e.g.
// {{"libfabric.provider", "shm"}}; viable() checks the provider they name
// (or the default one).
Backend libfabric_backend(
    absl::flat_hash_map<std::string, std::string> defaults = {});

// What a libfabric agent has done so far, for tests and tuning.
struct LibfabricStats {
  // The provider as libfabric reports it, e.g. "tcp;ofi_rxm".
  std::string provider;
  // How this agent pulls large buffers: "read" or "tagged".
  std::string rendezvous;
  // True when the progress thread sleeps on the completion queue's file
  // descriptor; false when it polls.
  bool sleeps_on_fd = false;
  // Eager buffers granted to each peer, and their size.
  uint32_t credits = 0;
  uint64_t eager_buffer_bytes = 0;
  // Payloads and storages of at least this many bytes go by rendezvous.
  uint64_t rendezvous_threshold = 0;
  uint64_t frames_sent = 0;
  uint64_t frames_received = 0;
  // Messages sent and received with at least one part by rendezvous.
  uint64_t rendezvous_sent = 0;
  uint64_t rendezvous_received = 0;
  uint64_t bytes_pulled = 0;
  // The most eager frames this agent has had in flight to one peer (never
  // more than the peer's credits plus its control slot).
  uint32_t max_frames_in_flight = 0;
  // How often sending found no credit left.
  uint64_t credit_waits = 0;
  // How often the progress thread found completions only once a sleep had
  // run out, not woken by the provider or a peer (a provider that does not
  // signal its descriptor, or a polled provider without doorbells).
  uint64_t late_wakeups = 0;
  uint64_t mr_cache_hits = 0;
  uint64_t mr_cache_misses = 0;
  uint64_t mr_cache_evictions = 0;
  // Connections to the provider's TCP listener that never made a
  // connection request and were reset (tcp;ofi_rxm: strangers).
  uint64_t strangers_reset = 0;
};

// The counters of `agent`, which must be a libfabric agent that has not
// shut down (else INVALID_ARGUMENT or CANCELLED). Asks the agent's progress
// thread and waits for it (DEADLINE_EXCEEDED after 10 s): call it from any
// thread but that agent's own callbacks.
[[nodiscard]] absl::StatusOr<LibfabricStats> libfabric_stats(Agent& agent);

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_LIBFABRIC_LIBFABRIC_AGENT_H_
