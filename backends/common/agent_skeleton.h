// AgentSkeleton: the agent every multi-process backend would otherwise
// write again, in the spirit of TensorPipe's channel_impl_boilerplate.h.
//
// It owns what an agent's state shares whatever moves its bytes: the setup
// (self, workers, store, limits, authenticator, dynamic flag, peer
// timeout), the peer table, the requests awaiting responses and their
// timers, the book of incoming requests, the closed flag under the mutex
// the backend's own members share, and the shutdown sequence. It
// implements send()'s prologue (closed, unknown peer, no shared transport,
// registering the request), start(), join(), add_peer(), the exchange of
// addresses, the order of shutdown() and create_agent(). A backend
// supplies only its transport, as hooks of `Derived` (CRTP):
//
//   // True on one of the backend's own threads (callbacks, executors);
//   // the skeleton adds its timer thread.
//   bool on_own_thread() const;
//   // What shutdown() takes out of the state, closes and joins.
//   struct Resources;  // default-constructible, movable
//   // Under mu_, closed_ already true: move the transport's objects out.
//   void take_resources(Resources& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
//   // Outside the lock: close them (their pending operations fail).
//   void close_resources(Resources& resources);
//   // Join their threads. May run on a thread of its own, after shutdown()
//   // has returned (the state is kept alive for it).
//   void join_resources(Resources& resources);
//   // The request (its id set, registered in pending_) leaves for `peer`;
//   // returns `pending.response` or a future chained from it. A failure
//   // after this point goes through fail_later() or pending_, never inline.
//   Future<Message> start_send(const Peer& peer, Message request,
//                              PendingRequests::Request pending);
//   // Sends the result of incoming request `id` back on `route`.
//   void send_response(const Route& route, int64_t id,
//                      const absl::StatusOr<Message>& result);
//   // Runs a request that arrived before start() on a thread of the agent.
//   void run_deferred_later(typename Incoming::Deferred deferred);
//   // What a peer published, as the address the backend connects to ("" if
//   // it shares no transport with this worker).
//   absl::StatusOr<std::string> address_of(const std::string& published);
//   // Sets the transport up and calls publish_addresses() (create_agent).
//   absl::Status init();
//
// and, if it keeps something per peer (the skeleton's defaults do nothing):
//
//   // Dynamic groups: `peer` is in the table now (add_peer()); readies the
//   // transport for it. An error is add_peer()'s, and takes the peer out
//   // of the table again unless it was there before.
//   absl::Status on_peer_added(const Peer& peer);
//   // Dynamic groups: `worker` has left the table (remove_peer()).
//   void on_peer_removed(const WorkerInfo& worker);
//
// Ownership: the state is held by a shared_ptr (SharedStateAgent's);
// callbacks hold it weakly. The timer queue is owned here and joined last.
//
// Thread safety: every public method may be called from any thread.
// shutdown() may be called from the agent's own threads (ShutdownSequence).
#ifndef TETHER_BACKENDS_COMMON_AGENT_SKELETON_H_
#define TETHER_BACKENDS_COMMON_AGENT_SKELETON_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/common/agent_support.h"
#include "backends/common/peer_table.h"
#include "backends/common/refusals.h"
#include "core/agent.h"
#include "core/host_address.h"
#include "core/auth/auth.h"
#include "core/future.h"
#include "core/toolkit/pending_requests.h"
#include "core/toolkit/timer.h"
#include "core/join/store_join.h"
#include "core/message.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tether::backends::common {

// What names a backend in the store and in messages.
struct BackendNames {
  // The registry name, also the join barrier's ("tensorpipe").
  const char* name;
  // How messages name it ("gRPC").
  const char* display;
  // Where workers publish their addresses in the store.
  const char* address_key_prefix;
  // The setting that names what the backend listens on ("grpc.address"),
  // or nullptr if it takes none. When the user leaves it out,
  // create_agent() fills it with the address chosen for every backend
  // (core/host_address.h).
  const char* address_setting = nullptr;
  // The setting that bounds how long the backend's own liveness bears a
  // silent peer ("grpc.keepalive_timeout_ms"), or nullptr if it has none,
  // and that setting's default. When the user leaves it out and the group's
  // peer timeout (AgentSetup::peer_timeout) is longer than the default,
  // create_agent() sets it to the peer timeout: no backend gives up on a
  // peer sooner than the group does (a worker stopped for 30 s under a 60 s
  // peer timeout is slow, not lost).
  const char* silence_setting = nullptr;
  absl::Duration silence_default = absl::ZeroDuration();
};

// "<display> agent of worker '<self>'": how a backend's messages open.
std::string agent_of(const BackendNames& names, absl::string_view self);

// UNAVAILABLE: `worker` left a PING unanswered for `peer_timeout` while
// calls to it waited: it is lost.
absl::Status lost_to_silence(const BackendNames& names, absl::string_view self,
                             const WorkerInfo& worker,
                             absl::Duration peer_timeout);

// UNAVAILABLE: `to` is known but shares no transport of the backend.
absl::Status no_shared_transport(const BackendNames& names,
                                 absl::string_view self, absl::string_view to);

// The ip and port in a published address record: "host:port" (gRPC) or
// lines "transport=address" (TensorPipe), of which tcp and uv are tcp-like;
// nullopt if no part is a host and a port.
std::optional<Endpoint> tcp_endpoint(absl::string_view published);

// The store set-up of every backend: a static group exchanges addresses
// (waiting up to `timeout` for all), a dynamic one publishes its own and
// reads the members'; each published text becomes a peer's address through
// `address_of`.
[[nodiscard]] absl::Status publish_addresses(
    const BackendNames& names, c10d::Store& store, const WorkerInfo& self,
    const std::vector<WorkerInfo>& workers, bool dynamic,
    const std::string& mine, absl::Duration timeout, PeerTable& peers,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        address_of);

template <typename Derived, typename Route>
class AgentSkeleton : public std::enable_shared_from_this<Derived> {
 public:
  using PendingRequests = tether::internal::PendingRequests;
  using Incoming = IncomingRequests<Route>;

  AgentSkeleton(const AgentSkeleton&) = delete;
  AgentSkeleton& operator=(const AgentSkeleton&) = delete;

  const WorkerInfo& self() const { return self_; }
  const std::vector<WorkerInfo>& workers() const { return workers_; }

  absl::Status start(RequestHandler handler) {
    absl::StatusOr<std::vector<typename Incoming::Deferred>> deferred =
        incoming_.start(std::move(handler),
                        [weak = this->weak_from_this()](
                            const Route& route, int64_t id,
                            const absl::StatusOr<Message>& result) {
                          if (std::shared_ptr<Derived> state = weak.lock()) {
                            state->send_response(route, id, result);
                          }
                        });
    if (!deferred.ok()) return deferred.status();
    for (typename Incoming::Deferred& entry : *deferred) {
      derived().run_deferred_later(std::move(entry));
    }
    return absl::OkStatus();
  }

  // The prologue every backend shares; refusals complete on the refusal
  // thread (core/agent.h: never inside send()). A peer the watch found lost
  // (below) is refused with its loss until it answers a probe again.
  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    return send_message(to, std::move(request), timeout, /*probe=*/false);
  }

  // Starts the watch of peers that calls wait on (create_agent(), once
  // init() succeeded).
  void start_watch() ABSL_LOCKS_EXCLUDED(mu_) { schedule_watch(); }

  absl::Status join(absl::Duration timeout,
                    const std::function<void()>& all_joined = {})
      ABSL_LOCKS_EXCLUDED(mu_) {
    return join_agent(
        joiner_, pending_, [this] { return incoming_.unanswered(); },
        [this] { return closed(); }, self_.name, timeout,
        liveness_of(&derived(), peer_timeout_), all_joined);
  }

  // Agent::endpoint_of, from what `worker` published in the store.
  absl::StatusOr<std::optional<Endpoint>> endpoint_of(
      const WorkerInfo& worker) const {
    std::optional<Peer> peer = peers_.by_name(worker.name);
    if (!(worker == self_) && !(peer.has_value() && peer->info == worker)) {
      return absl::NotFoundError(absl::StrCat(
          "worker '", worker.name, "' (rank ", worker.id,
          ") is not in the group of ", who()));
    }
    absl::StatusOr<std::string> published =
        lookup_address(*store_, names_.address_key_prefix, worker, who());
    if (!published.ok()) return published.status();
    return tcp_endpoint(*published);
  }

  absl::Status add_peer(const WorkerInfo& worker) {
    const bool known = peers_.by_name(worker.name).has_value();
    absl::Status added = common::add_peer(
        *store_, names_.address_key_prefix, dynamic_, worker, peers_,
        [this](const std::string& published) {
          return derived().address_of(published);
        },
        agent_of(names_, self_.name));
    if (!added.ok()) return added;
    {
      absl::MutexLock lock(&mu_);
      lost_.erase(worker.name);  // a worker joining under a lost one's name
    }
    std::optional<Peer> peer = peers_.by_rank(worker.id);
    if (!peer.has_value()) {  // removed meanwhile
      return absl::UnavailableError(absl::StrCat(
          who(), ": worker '", worker.name, "' left while it was being added"));
    }
    added = derived().on_peer_added(*peer);
    if (!added.ok() && !known) peers_.remove(worker);
    return added;
  }

  // Takes `worker` out of the table (sends to it fail at once from now on)
  // and tells the backend.
  void remove_peer(const WorkerInfo& worker) {
    if (peers_.remove(worker)) derived().on_peer_removed(worker);
  }

  // Stops at once (Agent::shutdown): refuses from now on, takes the
  // transport's resources out, fails what is pending with CANCELLED, closes
  // the transport, waits for handler calls under way and joins the
  // threads (on a thread of its own when called from one of ours).
  void shutdown() ABSL_LOCKS_EXCLUDED(mu_) {
    const bool own_thread = tether::internal::TimerQueue::running_owner() ==
                                static_cast<const void*>(this) ||
                            derived().on_own_thread();
    if (!shutdown_sequence_.begin(own_thread)) return;
    auto resources = std::make_shared<typename Derived::Resources>();
    std::shared_ptr<tether::internal::TimerQueue> timers;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      derived().take_resources(*resources);
      timers = std::move(timers_);
    }
    // Before the timers go.
    pending_.cancel_all(shut_down_with_request_pending(self_.name));
    derived().close_resources(*resources);
    // Handler calls already started finish first.
    incoming_.close();
    // A thread of ours cannot join itself: then another thread finishes,
    // holding the state. WARNING: it may outlive the agent.
    std::shared_ptr<Derived> keep;
    if (own_thread) keep = this->shared_from_this();
    shutdown_sequence_.finish(
        own_thread, [state = &derived(), keep = std::move(keep), resources,
                     timers = std::move(timers)]() mutable {
          state->join_resources(*resources);
          timers.reset();
          *resources = typename Derived::Resources();
        });
  }

 protected:
  AgentSkeleton(AgentSetup& setup, const BackendNames& names)
      : names_(names),
        self_(std::move(setup.self)),
        workers_(std::move(setup.workers)),
        store_(std::move(setup.store)),
        limits_(setup.limits),
        auth_(std::move(setup.auth)),
        dynamic_(setup.dynamic),
        peers_(workers_),
        peer_timeout_(setup.peer_timeout),
        poll_(setup.poll),
        joiner_(store_, names.name, self_.id,
                static_cast<int>(workers_.size())),
        incoming_(self_.name),
        timers_(std::make_unique<tether::internal::TimerQueue>(
            /*owner=*/static_cast<const void*>(this))),
        pending_(timers_.get()),
        probe_interval_(std::clamp(setup.peer_timeout / 4,
                                   absl::Milliseconds(20), absl::Seconds(1))) {}
  ~AgentSkeleton() = default;

  Derived& derived() { return static_cast<Derived&>(*this); }
  const Derived& derived() const { return static_cast<const Derived&>(*this); }

  bool closed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  // "<display> agent of worker '<self>'".
  std::string who() const { return agent_of(names_, self_.name); }

  // For init(): this worker's published text `mine`, and the peers'.
  absl::Status publish_addresses(const std::string& mine,
                                 absl::Duration timeout) {
    return common::publish_addresses(names_, *store_, self_, workers_, dynamic_,
                                     mine, timeout, peers_,
                                     [this](const std::string& published) {
                                       return derived().address_of(published);
                                     });
  }

  // The defaults of the optional hooks (a backend's own hide them).
  absl::Status on_peer_added(const Peer& /*peer*/) { return absl::OkStatus(); }
  void on_peer_removed(const WorkerInfo& /*worker*/) {}

  // Fails registered request `id` with `status` on the refusal thread: for
  // a start_send() that finds the request cannot leave.
  void fail_later(int64_t id, absl::Status status) {
    on_refusal_thread([weak = this->weak_from_this(), id,
                       status = std::move(status)]() mutable {
      if (std::shared_ptr<Derived> state = weak.lock()) {
        state->pending_.complete(id, std::move(status));
      }
    });
  }

  const BackendNames names_;
  const WorkerInfo self_;
  const std::vector<WorkerInfo> workers_;
  const std::shared_ptr<c10d::Store> store_;
  // What a peer's message may hold (AgentSetup::limits).
  const MessageLimits limits_;
  const std::optional<auth::Authenticator> auth_;
  // A dynamic group (AgentSetup::dynamic): peers come and go, and a worker
  // not known yet may connect (to say it joined).
  const bool dynamic_;
  // The peers, each with the address the backend connects to.
  PeerTable peers_;
  // Bound of a liveness probe in join() and in the watch of peers that
  // calls wait on (AgentSetup::peer_timeout).
  const absl::Duration peer_timeout_;
  // AgentSetup::poll, for the backend's waiting thread.
  const PollPolicy poll_;
  join::StoreJoin joiner_;
  Incoming incoming_;

  // Guards closed_ and the backend's own members.
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<tether::internal::TimerQueue> timers_ ABSL_GUARDED_BY(mu_);
  // Our requests awaiting their responses. Uses timers_ until shutdown()
  // has cancelled it.
  PendingRequests pending_;

 private:
  Future<Message> send_message(const WorkerInfo& to, Message request,
                               absl::Duration timeout, bool probe)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<Peer> peer = peers_.by_name(to.name);
    absl::StatusOr<PendingRequests::Request> pending;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) {
        return refused(sent_after_shutdown(self_.name, request.type, to.name));
      }
      if (!peer.has_value()) return refused(not_in_group(self_.name, to.name));
      if (auto lost = lost_.find(to.name); lost != lost_.end() && !probe) {
        return refused(lost->second);
      }
      if (peer->address.empty()) {
        return refused(no_shared_transport(names_, self_.name, to.name));
      }
      // Under mu_, so that shutdown() fails it.
      pending = pending_.add(timeout, request.type, to.name);
    }
    if (!pending.ok()) return refused(pending.status());
    request.id = pending->id;
    return derived().start_send(*peer, std::move(request), *std::move(pending));
  }

  // The watch: liveness while calls wait, bounded by the peer timeout as
  // join() is (docs/reliability.md, "Partitions"). Every probe interval, a
  // peer that a call (not a PING) has waited on for an interval or more,
  // and a peer found lost, gets a PING (one at a time). A PING left
  // unanswered for the peer timeout fails every request pending to that
  // peer with UNAVAILABLE naming it, and later sends are refused with the
  // same words until a PING is answered again. The transport cannot tell
  // a silent peer from a slow one: a TCP connection to a host cut off just
  // waits, retransmitting.
  void schedule_watch() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (closed_ || timers_ == nullptr) return;
    timers_->schedule(absl::Now() + probe_interval_,
                      [weak = this->weak_from_this()] {
                        if (std::shared_ptr<Derived> state = weak.lock()) {
                          state->watch_peers();
                        }
                      });
  }

  void watch_peers() ABSL_LOCKS_EXCLUDED(mu_) {
    const absl::Time now = absl::Now();
    std::vector<std::string> names;
    for (const auto& [name, since] : pending_.waiting_since()) {
      if (now - since >= probe_interval_) names.push_back(name);
    }
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      // This tick came late: this process was stopped or starved. A probe
      // sent before then proves nothing about its peer.
      if (now - last_watch_ > probe_interval_ + peer_timeout_ / 2) {
        stalled_at_ = now;
      }
      last_watch_ = now;
      for (const auto& [name, why] : lost_) names.push_back(name);
    }
    std::vector<WorkerInfo> probe;
    for (const std::string& name : names) {
      std::optional<Peer> peer = peers_.by_name(name);
      if (!peer.has_value()) continue;
      absl::MutexLock lock(&mu_);
      if (probing_.try_emplace(name, now).second) probe.push_back(peer->info);
    }
    for (const WorkerInfo& worker : probe) {
      Message ping;
      ping.type = MessageType::kPing;
      send_message(worker, std::move(ping), peer_timeout_, /*probe=*/true)
          .on_complete([weak = this->weak_from_this(),
                        worker](const absl::StatusOr<Message>& answer) {
            // Off the completing thread: it may be one that holds mu_.
            on_refusal_thread([weak, worker, status = answer.status()] {
              if (std::shared_ptr<Derived> state = weak.lock()) {
                state->probe_answered(worker, status);
              }
            });
          });
    }
    schedule_watch();
  }

  void probe_answered(const WorkerInfo& worker, const absl::Status& answer)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Status loss;
    {
      absl::MutexLock lock(&mu_);
      auto probe = probing_.find(worker.name);
      if (probe == probing_.end()) return;
      const absl::Time sent = probe->second;
      probing_.erase(probe);
      if (answer.ok()) {
        lost_.erase(worker.name);
        return;
      }
      if (answer.code() != absl::StatusCode::kDeadlineExceeded) return;
      if (sent <= stalled_at_) return;  // we were away, not it
      loss = lost_to_silence(names_, self_.name, worker, peer_timeout_);
      lost_.insert_or_assign(worker.name, loss);
    }
    pending_.fail_peer(worker.name, loss);
  }

  // How often the watch looks (a quarter of the peer timeout, from 20 ms
  // to 1 s).
  const absl::Duration probe_interval_;
  // Peers a watch PING is on its way to (since when), and peers found
  // lost, with why.
  absl::flat_hash_map<std::string, absl::Time> probing_ ABSL_GUARDED_BY(mu_);
  // The last tick of the watch, and the last one that came late.
  absl::Time last_watch_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time stalled_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_map<std::string, absl::Status> lost_ ABSL_GUARDED_BY(mu_);
  ShutdownSequence shutdown_sequence_;
};

// Backend::create over an AgentSkeleton: checks the store, fills in the
// backend's address setting when the user gave none (core/host_address.h:
// the interface variable, else the route to the rendezvous host), parses
// the settings with `parse`, builds `State(setup, settings)`, runs its
// init() (shutting it down if that fails) and wraps it in a
// SharedStateAgent.
template <typename State, typename Parse>
absl::StatusOr<std::unique_ptr<Agent>> create_agent(const BackendNames& names,
                                                    AgentSetup setup,
                                                    const Parse& parse) {
  if (setup.store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", names.name, " backend needs the group's rendezvous store"));
  }
  if (names.address_setting != nullptr &&
      !setup.settings.contains(names.address_setting)) {
    absl::StatusOr<std::string> host =
        default_host_address(setup.rendezvous_host);
    if (!host.ok()) return host.status();
    setup.settings[names.address_setting] = *std::move(host);
    setup.address_defaulted = true;
  }
  if (names.silence_setting != nullptr &&
      !setup.settings.contains(names.silence_setting) &&
      setup.peer_timeout > names.silence_default) {
    setup.settings[names.silence_setting] = absl::StrCat(
        absl::ToInt64Milliseconds(std::min(setup.peer_timeout, absl::Hours(24))));
  }
  auto settings = parse(setup.settings);
  if (!settings.ok()) return settings.status();
  auto state = std::make_shared<State>(std::move(setup), *std::move(settings));
  absl::Status initialized = state->init();
  if (!initialized.ok()) {
    state->shutdown();
    return initialized;
  }
  state->start_watch();
  return std::make_unique<SharedStateAgent<State>>(std::move(state));
}

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_AGENT_SKELETON_H_
