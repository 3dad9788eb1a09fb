// Agent: the seam between tether and its transports.
//
// An Agent moves Messages between named workers and nothing else: no RRef,
// autograd or optimizer logic lives in a backend. The Worker (core/worker.h)
// owns one Agent, installs a request handler with start(), and sends through
// it. Every backend (backends/*) implements this interface and passes the
// agent conformance suite (testing/agent_conformance.h).
//
// Ownership: send() takes the Message by value; the agent keeps it (and so
// its storages) alive until the request has left or failed. Received
// messages own their payload and freshly allocated storages.
//
// Thread safety: every method may be called from any thread, concurrently.
//
// Callbacks and threads: the Future returned by send() completes exactly once,
// never inline inside send(), on an agent thread; its callbacks must not
// block. That holds for refusals too (after shutdown, unknown peer, over a
// limit): they complete on the process's refusal thread, one helper and one
// wording for every backend (backends/common/refusals.h). The request
// handler is called on an agent thread for each incoming request and must
// not block either: it returns a Future of the response, and the agent
// sends that response back when the future completes.
#ifndef TETHER_CORE_AGENT_H_
#define TETHER_CORE_AGENT_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/auth/auth.h"
#include "core/future.h"
#include "core/message.h"
#include "core/toolkit/poll_policy.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tether {

// A worker's identity: its unique name and its id, which is its rank.
struct WorkerInfo {
  std::string name;
  int32_t id = -1;

  friend bool operator==(const WorkerInfo& a, const WorkerInfo& b) {
    return a.name == b.name && a.id == b.id;
  }
};

// "<id> (<name>)": how an error raised on a worker names it ("Error on
// worker 0 (a): ...").
inline std::string describe(const WorkerInfo& info) {
  return absl::StrCat(info.id, " (", info.name, ")");
}

// "worker '<name>' (rank <id>)": how a refusal names the worker it is about
// ("worker 'b' (rank 1) has left the group ...").
inline std::string named_worker(const WorkerInfo& info) {
  return absl::StrCat("worker '", info.name, "' (rank ", info.id, ")");
}

// An ip address and a port a worker listens on (Agent::endpoint_of).
struct Endpoint {
  std::string ip;
  int port = 0;
};

// How an agent reaches a peer (Agent::link_to): what carries its messages
// and what carries its tensors' bytes.
struct PeerLink {
  std::string transport;
  std::string channel;
};

// Called for each incoming request; see the header comment for its contract.
using RequestHandler = std::function<Future<Message>(Message request)>;

class Agent {
 public:
  virtual ~Agent() = default;

  // Starts serving requests with `handler`. Called once, before any send.
  [[nodiscard]] virtual absl::Status start(RequestHandler handler) = 0;

  // Sends `request` to `to` and completes with its response. Errors:
  // UNAVAILABLE when the peer is lost or unknown to the transport,
  // DEADLINE_EXCEEDED when `timeout` passes first (InfiniteDuration = none),
  // CANCELLED when this agent shuts down with the request pending.
  virtual Future<Message> send(const WorkerInfo& to, Message request,
                               absl::Duration timeout) = 0;

  virtual const WorkerInfo& self() const = 0;

  // The workers of the group the agent was set up with, in rank order. In
  // a dynamic group (AgentSetup::dynamic) the group changes afterwards:
  // Worker::get_all_worker_infos() is the current one.
  virtual const std::vector<WorkerInfo>& worker_infos() const = 0;

  // Dynamic groups (AgentSetup::dynamic) only; a static group's agent
  // refuses both with FAILED_PRECONDITION. The Worker calls them when a
  // member tells it of a change (core/join/membership.h); the backend only
  // updates its table of peers.
  //
  // `worker` has joined: its agent published its address in the store
  // before it said so. Sends to it work from the return on. ALREADY_EXISTS
  // if another peer has its name or rank; UNAVAILABLE if its address cannot
  // be read. Blocks briefly (a store read): not on an agent thread.
  [[nodiscard]] virtual absl::Status add_peer(const WorkerInfo& worker) = 0;
  // `worker` has left (after its graceful leave: nothing is in flight to
  // it): later sends to it fail at once with UNAVAILABLE naming it, and the
  // agent lets go of its connections to it, so that a worker that joins
  // later with the same rank gets fresh ones. No-op for an unknown worker.
  virtual void remove_peer(const WorkerInfo& worker) = 0;

  // Graceful drain: blocks until every worker of the group has called join()
  // and no request is in flight anywhere in the group, or until `timeout`
  // (DEADLINE_EXCEEDED; InfiniteDuration: none). A worker that is lost (its
  // PING fails, or goes unanswered for AgentSetup::peer_timeout) ends it
  // with UNAVAILABLE naming that worker. The agent keeps serving while it
  // waits. `all_joined`, if set, is called once every worker has called
  // join() and before the group drains (what it sends is drained too): the
  // peer's barrier before it deletes its users' references.
  [[nodiscard]] virtual absl::Status join(
      absl::Duration timeout, const std::function<void()>& all_joined = {}) = 0;

  // Stops at once: pending sends fail with CANCELLED, later sends fail with
  // CANCELLED, incoming requests are refused. Idempotent.
  virtual void shutdown() = 0;

  // Where `worker` (this one included) listens for its peers, when its
  // transport has an ip and a port (tcp-like: TensorPipe's tcp and uv,
  // gRPC, libfabric's tcp providers), from the address it published:
  // Paddle's WorkerInfo.ip/.port. nullopt when it has none (libfabric's
  // shm) or the backend does not say (this
  // default). NOT_FOUND for a worker not in the group; UNAVAILABLE if what
  // it published cannot be read. Blocks briefly (a store read): not on an
  // agent thread.
  [[nodiscard]] virtual absl::StatusOr<std::optional<Endpoint>> endpoint_of(
      const WorkerInfo& worker) const {
    (void)worker;
    return std::optional<Endpoint>();
  }

  // How this agent moves messages to `worker`, for diagnostics (a log
  // line, debug info, a test that checks which way the bytes go): the
  // transport and the channel of tensors, as the backend names them. The
  // tensorpipe backend says which its negotiation picks for the pair
  // ("tcp" and "cma_write" within a host, "tcp" and "basic" across
  // hosts). UNIMPLEMENTED where the backend does not say (this default);
  // NOT_FOUND for a worker not in the group. Blocks briefly (a store
  // read): not on an agent thread.
  [[nodiscard]] virtual absl::StatusOr<PeerLink> link_to(
      const WorkerInfo& worker) const {
    return absl::UnimplementedError(
        absl::StrCat("the agent does not say how it reaches '", worker.name,
                     "'"));
  }
};

// What a backend factory gets to build an agent for one worker.
struct AgentSetup {
  WorkerInfo self;
  std::vector<WorkerInfo> workers;  // in rank order, self included
  // A dynamic group (init without a world size): `workers` are the members
  // when this worker joins (ranks may have gaps), more come and go through
  // Agent::add_peer / remove_peer, and peers the agent does not know yet
  // may connect to it (a joiner tells each member of itself over its own
  // connection). The backend publishes its address at init with
  // publish_address() and reads each peer's with lookup_address()
  // (backends/common) instead of waiting for the whole group. join() is
  // not used (the Worker drains a leaving worker itself).
  bool dynamic = false;
  // The rendezvous store, already prefixed for this group; backends publish
  // and look up their addresses here. Outlives the agent.
  std::shared_ptr<c10d::Store> store;
  // A key that names the group within this process (the init method).
  std::string group_key;
  // The host of the rendezvous store (MASTER_ADDR, or HOST of
  // tcp://HOST:PORT; "" for file:// and memory://): what the address a
  // backend listens on by default is chosen from (core/host_address.h).
  std::string rendezvous_host;
  // Set by backends/common's create_agent() when the user gave no address
  // setting and it filled one in with core/host_address.h's choice: a
  // backend that may fall back to its own choice when a given address
  // does not work (libfabric's providers) treats it as not given.
  bool address_defaulted = false;
  // Per-backend settings, "key" -> "value" (the backend documents its keys).
  absl::flat_hash_map<std::string, std::string> settings;
  // What an incoming message may announce (see core/message.h).
  MessageLimits limits;
  // How long a peer may leave a liveness probe (a PING, which the Worker
  // answers on the agent's thread) unanswered before join() takes it for
  // lost (RpcOptions::peer_timeout).
  absl::Duration peer_timeout = absl::Seconds(60);
  // Set when peers must authenticate (core/auth): the backend runs the
  // challenge-response when it sets up each connection and refuses, with a
  // log line, a peer that fails it.
  std::optional<auth::Authenticator> auth;
  // How long the backend's thread that waits for messages keeps polling
  // after its last one before it sleeps, and whether only on spare cores
  // (RpcOptions::busy_poll and spare_core_poll; core/toolkit/poll_policy.h).
  // The default: it sleeps at once.
  PollPolicy poll = PollPolicy();
};

using AgentFactory =
    std::function<absl::StatusOr<std::unique_ptr<Agent>>(AgentSetup setup)>;

}  // namespace tether

#endif  // TETHER_CORE_AGENT_H_
