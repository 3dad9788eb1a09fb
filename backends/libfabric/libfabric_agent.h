// The libfabric backend: agents that talk through libfabric (OFI) reliable
// datagram endpoints, for RDMA-capable fabrics (docs/architecture.md
// section 2).
//
// Each agent opens one FI_EP_RDM endpoint with one completion queue for the
// provider its settings name, publishes the endpoint's name (fi_getname) in
// the group's store under "tether/libfabric/<rank>" with what peers need
// (provider, buffer size, credits, how it pulls large buffers), waits until
// every rank has published, and inserts every address into an address
// vector in rank order. There are no connections to open: the provider
// connects (tcp;ofi_rxm) or maps (shm) on the first message.
//
// Dynamic groups (AgentSetup::dynamic): the agent publishes its record
// without waiting and reads the members'. add_peer() has the progress
// thread insert a joiner's address and make its state, growing the eager
// pool; a hello or request from a rank not known yet is taken once the
// record published under that rank names a worker (the joiner talks to a
// member before MEMBER_JOIN); remove_peer() stops sends at once and drops
// the peer (fi_av_remove) on its goodbye or when a worker joins with its
// rank. docs/reliability.md, "Groups that change".
//
// Small messages: a request or response whose payload, storages and
// descriptors fit one eager buffer travels as one tagged message into one
// of the receiver's pre-posted buffers (world size x (credits + 1) of them).
// Flow control is by credits: each receiver grants each peer `credits`
// buffers; a sender spends one per frame and waits (queues) at zero; the
// receiver returns credits in the header of every frame it sends back, or,
// when it has nothing to send, in a credit frame that uses a control slot
// reserved per peer. So a fast sender never has more frames in flight to a
// peer than the peer has buffers for it, whatever the peer's speed, and
// never relies on the provider buffering unexpected messages.
//
// Large buffers: a payload or storage of at least the rendezvous threshold
// stays where it is. The sender registers it (fi_mr_reg, through a
// registration cache: internal/mr_cache.h) and describes it in the eager
// frame; the receiver allocates the storage and pulls the bytes straight
// into it with fi_read where it has FI_RMA, or, in tagged mode, posts tagged
// receives into it and asks the sender to send (clear-to-send). Then it
// tells the sender to release its buffers. A message whose descriptors do
// not fit an eager buffer (thousands of storages) has its whole body pulled
// the same way first. The wire format is internal/framing.h.
//
// Errors and lost peers: an error completion (fi_cq_readerr) of a send or
// pull fails what waits for that peer with UNAVAILABLE naming it and
// libfabric's reason. A peer that shuts down says goodbye, which fails its
// pending requests with UNAVAILABLE at once. A peer that dies silently
// (SIGKILL, a lost host) is found by keepalives: while requests, transfers
// or frames wait on a peer that has said nothing for a fifth of
// libfabric.peer_timeout_ms, the agent sends it a keepalive, which its
// progress thread answers (a busy handler does not delay it); after
// libfabric.peer_timeout_ms of silence in which the first keepalive went
// unanswered while our own progress thread ran (a process that was itself
// stopped asks again first), or at once when a same-host (shm)
// peer's process is gone, the peer is lost: its requests fail with
// UNAVAILABLE, and so do later sends to it until it is heard from again. So
// a request to a dead peer fails within min(call timeout, peer timeout plus
// a tick): DEADLINE_EXCEEDED if its own timeout comes first, UNAVAILABLE
// otherwise.
//
// Authentication (AgentSetup::auth set): there are no connections, so the
// challenge-response of core/auth runs per ordered pair of workers when the
// first request goes from one (the client) to the other (the server):
// hello, the server's proof, the client's proof, accepted (or refused, with
// the reason). The client's requests wait until the server has accepted;
// the server drops, with a log line, every request, response, release,
// clear-to-send and goodbye frame from a peer that has not authenticated in
// that direction (credit and keepalive frames pass: they only feed flow
// control), and refuses its requests. A refused handshake fails the
// client's calls to that peer at once with UNAUTHENTICATED naming the peer
// and the reason; the next call tries again. Frames are not bound to the
// handshake and nothing is encrypted (docs/security.md).
//
// Strangers (docs/security.md): under tcp;ofi_rxm anyone who can reach the
// endpoint's TCP port can connect. libfabric 1.17's tcp provider holds a
// connection whose request never comes, or is cut short, for ever (and one
// whose client closed early as a descriptor in CLOSE_WAIT): the progress
// thread's listener guard (internal/listener_guard.h) resets, every 500 ms,
// each connection on the listener that the provider has not answered once
// its client has gone or after libfabric.accept_timeout_ms, so that the
// provider closes and frees it. Connections the provider has taken on are
// left alone; what their peers may send is the provider's to check.
//
// Limits (AgentSetup::limits): a message frame announcing more payload
// bytes, storages or storage bytes than the limits, or a remote descriptor
// list longer than a message within them can need, is refused before
// anything is allocated or pulled for it; a request's sender gets
// RESOURCE_EXHAUSTED naming the limit, and both agents carry on.
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
//                             2 KiB: 3072 on shm, whose larger messages take
//                             several steps of the receiver's progress)
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
//                             (default 5000; see "Strangers" below)
//   libfabric.mr_cache_entries, libfabric.mr_cache_bytes  bounds of the
//                             registration cache (default 64 entries,
//                             256 MiB; 0 entries: no cache)
//   libfabric.spin_us         how long the progress thread keeps polling
//                             after its last work before it sleeps (default
//                             RpcOptions::busy_poll, 0: on a machine whose
//                             cores are shared, a
//                             spinning thread delays the ones it waits for;
//                             on dedicated cores a spin of tens of
//                             microseconds saves wake-ups)
//
// Memory: world size x (credits + 1) receive buffers and 64 send buffers of
// threshold + 1 KiB each, plus what the registration cache holds.
//
// Threads: each agent runs one progress thread: it drives the completion
// queue, runs the request handler and completes send() futures; other
// threads hand it work through a queue and wake it. Only the holder of the
// agent's drive token calls libfabric: the progress thread, except while it
// sleeps; on tcp;ofi_rxm, a caller's thread sends a small request itself
// when the token is free, and drives the queue while it waits for the
// answer (the assist, backends/common/fd_assist.h).
// It sleeps on the completion queue's file descriptor where the provider
// has one (tcp;ofi_rxm); where the queue must be polled (shm), same-host
// peers ring its doorbell (a Unix datagram socket named in the address
// record) after each frame they send, and it polls only for peers without
// one. While anything waits, its sleeps are short naps, so that a wake-up a
// provider fails to signal costs little. Plus one timer thread. join() is
// the store barrier of core/join. docs/libfabric.md has the rest: providers,
// protocol, failures, limits; internal/agent_state.h maps the
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
