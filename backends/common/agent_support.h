// What the multi-process agents (tensorpipe, grpc, libfabric) share, whatever
// moves their bytes: the Agent over a shared state, the exchange of
// addresses through the rendezvous store, the book of incoming requests
// (handler, requests that arrive before start(), calls in progress,
// requests not yet answered), join() over the store barrier and the
// choreography of a shutdown() that the agent's own threads may call.
//
// Used by backends/tensorpipe, backends/grpc and backends/libfabric (which
// keeps its own book of incoming requests); each keeps its transport,
// framing and threads to itself.
//
// Thread safety: each class says; the functions may be called from any
// thread.
#ifndef TETHER_BACKENDS_COMMON_AGENT_SUPPORT_H_
#define TETHER_BACKENDS_COMMON_AGENT_SUPPORT_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/common/refusals.h"  // sent_after_shutdown, for libfabric
#include "core/agent.h"
#include "core/future.h"
#include "core/toolkit/pending_requests.h"
#include "core/join/store_join.h"
#include "core/message.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tether::backends::common {

// Sets a thread-local mark ("this thread runs a callback of agent X") for
// the life of the scope, and restores the previous one.
class ScopedMark {
 public:
  ScopedMark(const void*& slot, const void* owner)
      : slot_(slot), saved_(std::exchange(slot, owner)) {}
  ~ScopedMark() { slot_ = saved_; }
  ScopedMark(const ScopedMark&) = delete;
  ScopedMark& operator=(const ScopedMark&) = delete;

 private:
  const void*& slot_;
  const void* const saved_;
};

// The Agent of a backend whose state its callbacks share (and hold weakly):
// forwards every call, and shuts the state down when destroyed. `State` has
// the Agent's methods under these names: start, send, self, workers, join,
// add_peer, remove_peer, shutdown.
// Whether State answers Agent::endpoint_of (AgentSkeleton's states do).
template <typename S, typename = void>
struct HasEndpointOf : std::false_type {};
template <typename S>
struct HasEndpointOf<S, std::void_t<decltype(std::declval<const S&>().endpoint_of(
                            std::declval<const WorkerInfo&>()))>>
    : std::true_type {};

// Whether State answers Agent::link_to (the tensorpipe backend's does).
template <typename S, typename = void>
struct HasLinkTo : std::false_type {};
template <typename S>
struct HasLinkTo<S, std::void_t<decltype(std::declval<const S&>().link_to(
                        std::declval<const WorkerInfo&>()))>>
    : std::true_type {};

template <typename State>
class SharedStateAgent final : public Agent {
 public:
  explicit SharedStateAgent(std::shared_ptr<State> state)
      : state_(std::move(state)) {}
  ~SharedStateAgent() override { state_->shutdown(); }

  absl::Status start(RequestHandler handler) override {
    return state_->start(std::move(handler));
  }
  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout) override {
    return state_->send(to, std::move(request), timeout);
  }
  const WorkerInfo& self() const override { return state_->self(); }
  const std::vector<WorkerInfo>& worker_infos() const override {
    return state_->workers();
  }
  absl::Status join(absl::Duration timeout,
                    const std::function<void()>& all_joined = {}) override {
    return state_->join(timeout, all_joined);
  }
  absl::Status add_peer(const WorkerInfo& worker) override {
    return state_->add_peer(worker);
  }
  void remove_peer(const WorkerInfo& worker) override {
    state_->remove_peer(worker);
  }
  void shutdown() override { state_->shutdown(); }
  absl::StatusOr<std::optional<Endpoint>> endpoint_of(
      const WorkerInfo& worker) const override {
    if constexpr (HasEndpointOf<State>::value) {
      return state_->endpoint_of(worker);
    } else {
      return Agent::endpoint_of(worker);
    }
  }
  absl::StatusOr<PeerLink> link_to(const WorkerInfo& worker) const override {
    if constexpr (HasLinkTo<State>::value) {
      return state_->link_to(worker);
    } else {
      return Agent::link_to(worker);
    }
  }

  // For backend-specific queries (statistics) on the agent users hold.
  State& state() { return *state_; }

 private:
  const std::shared_ptr<State> state_;
};

// Publishes `mine` under "<key_prefix><rank>" and returns what every rank of
// `world_size` published there, in rank order, once all have. Blocks.
// DEADLINE_EXCEEDED naming the ranks still missing after `timeout`,
// UNAVAILABLE if the store fails; `who` ("gRPC agent of worker 'w0'") opens
// the message.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> exchange_addresses(
    c10d::Store& store, absl::string_view key_prefix, int rank, int world_size,
    absl::string_view mine, absl::Duration timeout, absl::string_view who);

// How join_agent tells a lost worker from a slow one: it sends each worker
// it waits for a PING with `send` (the agent's own), bounded by
// `peer_timeout`; any answer means alive.
struct Liveness {
  const std::vector<WorkerInfo>* workers = nullptr;  // in rank order
  std::function<Future<Message>(const WorkerInfo& to, Message ping,
                                absl::Duration timeout)>
      send;
  absl::Duration peer_timeout = absl::Seconds(60);
};

// The Liveness of a backend's State (SharedStateAgent's shape: workers()
// and send()); `state` must outlive the join.
template <typename State>
Liveness liveness_of(State* state, absl::Duration peer_timeout) {
  return Liveness{&state->workers(),
                  [state](const WorkerInfo& to, Message ping,
                          absl::Duration bound) {
                    return state->send(to, std::move(ping), bound);
                  },
                  peer_timeout};
}

// Agent::join() over `joiner`: `pending` holds the agent's requests awaiting
// responses, `unanswered` counts the requests it received and has not
// answered, `closed` says whether it has shut down (CANCELLED then).
[[nodiscard]] absl::Status join_agent(
    join::StoreJoin& joiner, tether::internal::PendingRequests& pending,
    const std::function<int64_t()>& unanswered,
    const std::function<bool()>& closed, absl::string_view self_name,
    absl::Duration timeout, const Liveness& liveness,
    const std::function<void()>& all_joined = {});

// The PINGs of join_agent: OK if every worker of `ranks` answered within
// `liveness.peer_timeout`, else UNAVAILABLE naming the first that did not
// (CANCELLED if this agent shut down meanwhile).
[[nodiscard]] absl::Status check_alive(const Liveness& liveness,
                                       const std::vector<int>& ranks);

// Calls `handler`; a throw or an invalid future becomes a future failed with
// INTERNAL naming worker `self_name`.
Future<Message> call_handler(const RequestHandler& handler, Message request,
                             absl::string_view self_name);

// The thread-local mark of request handler calls (see IncomingRequests).
const void*& handler_mark();

// The incoming side of an agent. `Route` is how a response finds its way
// back (the connection a request came on, held weakly).
//
// Thread safety: every method may be called from any thread. The handler
// runs on the thread that calls arrived() or run_deferred(); `respond` runs
// on the thread that completes the handler's future.
template <typename Route>
class IncomingRequests {
 public:
  struct Deferred {
    Route route;
    Message request;
  };
  // Sends the result of request `id` back on `route`, then calls
  // answered(). Holds the agent weakly: it may run after the agent is gone.
  using Respond = std::function<void(const Route& route, int64_t id,
                                     const absl::StatusOr<Message>& result)>;

  explicit IncomingRequests(std::string self_name)
      : self_name_(std::move(self_name)) {}

  // Installs the handler and what sends its responses, and returns the
  // requests that arrived before, for the agent to pass to run_deferred()
  // on a thread of its own. INVALID_ARGUMENT when called twice, CANCELLED
  // after close().
  [[nodiscard]] absl::StatusOr<std::vector<Deferred>> start(
      RequestHandler handler, Respond respond) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return absl::CancelledError(
          absl::StrCat("worker '", self_name_, "' has shut down"));
    }
    if (serving_ != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("start() called twice on worker '", self_name_, "'"));
    }
    serving_ = std::make_shared<const Serving>(
        Serving{std::move(handler), std::move(respond)});
    std::vector<Deferred> deferred;
    deferred.swap(deferred_);
    return deferred;
  }

  // A request arrived on `route`: the handler gets it now, on this thread,
  // or after start(). Dropped after close().
  void arrived(Route route, Message request) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<const Serving> serving;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      ++unanswered_;
      if (serving_ == nullptr) {
        deferred_.push_back(Deferred{std::move(route), std::move(request)});
        return;
      }
      serving = serving_;
      ++running_;
    }
    run(*serving, std::move(route), std::move(request));
  }

  // One of the requests start() returned.
  void run_deferred(Deferred deferred) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<const Serving> serving;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      serving = serving_;
      ++running_;
    }
    run(*serving, std::move(deferred.route), std::move(deferred.request));
  }

  // The response to a request has left, or has nowhere to go.
  void answered() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --unanswered_;
  }

  int64_t unanswered() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return unanswered_;
  }

  // Refuses requests from now on, drops the deferred ones and waits until
  // no handler call is in progress, but one this thread may be inside of.
  void close() ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<const Serving> serving;
    std::vector<Deferred> deferred;
    const int own = handler_mark() == this ? 1 : 0;
    absl::MutexLock lock(&mu_);
    closed_ = true;
    serving.swap(serving_);
    deferred.swap(deferred_);
    auto idle = [this, own]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return running_ <= own;
    };
    mu_.Await(absl::Condition(&idle));
    // WARNING: `serving` and `deferred` may hold user objects: they go after
    // the lock (declared before it).
  }

 private:
  struct Serving {
    RequestHandler handler;
    Respond respond;
  };

  void run(const Serving& serving, Route route, Message request)
      ABSL_LOCKS_EXCLUDED(mu_) {
    const int64_t id = request.id;
    Future<Message> response;
    {
      ScopedMark mark(handler_mark(), this);
      response = call_handler(serving.handler, std::move(request), self_name_);
    }
    {
      absl::MutexLock lock(&mu_);
      --running_;
    }
    response.on_complete([respond = serving.respond, route = std::move(route),
                          id](const absl::StatusOr<Message>& result) {
      respond(route, id, result);
    });
  }

  const std::string self_name_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const Serving> serving_ ABSL_GUARDED_BY(mu_);
  std::vector<Deferred> deferred_ ABSL_GUARDED_BY(mu_);
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

// The order of an agent's shutdown() when its own threads (callbacks,
// handlers, timers) may call it: the first call shuts down; a later call
// returns once the first is done, or at once if it comes from one of the
// agent's threads (the first may be waiting for that very thread). The
// first call's joins run inline, or, when it comes from one of the agent's
// threads (which cannot join themselves), on a thread of their own that a
// later call from elsewhere waits for.
//
// Thread safety: begin() from any thread; finish() once, by the caller
// begin() chose.
class ShutdownSequence {
 public:
  // True for the first call, which then closes the agent and calls
  // finish(); false for a later call, once the first is done.
  [[nodiscard]] bool begin(bool own_thread) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `joins` (inline, or on a detached thread when `own_thread`: it
  // must own what it touches) and marks the shutdown done.
  void finish(bool own_thread, std::function<void()> joins)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // Set when the joins run on a thread of their own.
  std::shared_ptr<absl::Notification> finisher_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_AGENT_SUPPORT_H_
