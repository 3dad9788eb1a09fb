// What the multi-process backends (tensorpipe, libfabric; gRPC to come)
// share around their own transports: the Agent that forwards to a backend's
// state, the once-only shutdown that may start on the agent's own threads,
// the exchange of addresses through the group's store, join() on the store
// barrier, and the guarded call of the request handler.
//
// Each backend keeps its transport in a State object (shared with its
// callbacks, which hold it weakly) with the Agent's methods plus init();
// StateAgent is the Agent users hold.
#ifndef TETHER_BACKENDS_COMMON_AGENT_SUPPORT_H_
#define TETHER_BACKENDS_COMMON_AGENT_SUPPORT_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/agent.h"
#include "core/future.h"
#include "core/internal/pending_requests.h"
#include "core/join/store_join.h"
#include "core/message.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tether::backends::common {

// The Agent of a backend whose State has start(), send(), self(),
// workers(), join() and shutdown() as the Agent's. Destroying it shuts the
// state down. Thread safety: as State's.
template <typename State>
class StateAgent final : public Agent {
 public:
  explicit StateAgent(std::shared_ptr<State> state)
      : state_(std::move(state)) {}

  ~StateAgent() override { state_->shutdown(); }

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

  absl::Status join(absl::Duration timeout) override {
    return state_->join(timeout);
  }

  void shutdown() override { state_->shutdown(); }

  State& state() { return *state_; }

 private:
  const std::shared_ptr<State> state_;
};

// The agent of `state` once its init() has succeeded; otherwise shuts the
// state down and returns init()'s error.
template <typename State>
absl::StatusOr<std::unique_ptr<Agent>> start_agent(
    std::shared_ptr<State> state) {
  absl::Status initialized = state->init();
  if (!initialized.ok()) {
    state->shutdown();
    return initialized;
  }
  return std::make_unique<StateAgent<State>>(std::move(state));
}

// Agent::shutdown() done exactly once, from any thread, the agent's own
// threads included. The first call does the work; when it runs on one of
// the agent's threads, which cannot join themselves, its joins run on a
// thread of their own. Later calls return once the first call's work and
// joins are done, except on the agent's own threads, which return at once
// (the first call may be waiting for them). Thread-safe.
class ShutdownOnce {
 public:
  // True for the first call only, whose caller does its work and then
  // calls finish(). Later calls block as said above and return false.
  bool begin(bool on_own_thread) ABSL_LOCKS_EXCLUDED(mu_);

  // Called once, by the first caller: runs `joins` on this thread, or on a
  // detached one when `on_own_thread` (WARNING: `joins` must then own what
  // it touches, for it may outlive the agent); then releases later callers.
  void finish(bool on_own_thread, std::function<void()> joins)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // Notified when `joins` has run.
  std::shared_ptr<absl::Notification> joined_ ABSL_GUARDED_BY(mu_);
};

// Publishes `mine` in `store` under "<key_prefix><rank>", waits up to
// `timeout` until every rank of `world_size` has published, and returns
// what each published, in rank order. Errors, their text starting with
// `who`: DEADLINE_EXCEEDED naming the ranks that did not publish,
// UNAVAILABLE when the store fails.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> exchange_through_store(
    c10d::Store& store, absl::string_view key_prefix, int rank,
    int world_size, const std::string& mine, absl::Duration timeout,
    absl::string_view who);

// Agent::join() on the store barrier of core/join, for an agent whose
// outgoing requests are in `pending` and whose `closed` flag (it has shut
// down: CANCELLED, naming `worker`, before or after the barrier) and count
// of `incoming` requests not yet answered are guarded by `mu`, which the
// caller does not hold.
[[nodiscard]] absl::Status join_group(join::StoreJoin& joiner,
                                      internal::PendingRequests& pending,
                                      absl::Mutex& mu, const bool& closed,
                                      const int64_t& incoming,
                                      absl::string_view worker,
                                      absl::Duration timeout);

// start()'s checks, with the agent's lock held: CANCELLED once `closed`,
// INVALID_ARGUMENT when `slot` holds a handler already; else installs
// `handler` in `slot`.
[[nodiscard]] absl::Status install_handler(
    RequestHandler handler, bool closed, absl::string_view worker,
    std::shared_ptr<const RequestHandler>& slot);

// The error of a send() after shutdown (CANCELLED).
absl::Status sent_after_shutdown(absl::string_view worker, MessageType type,
                                 absl::string_view to);

// Calls `handler` with `request`; an exception it throws, or an invalid
// future it returns, becomes a failed future (INTERNAL, naming `worker`).
Future<Message> call_handler(const RequestHandler& handler, Message request,
                             absl::string_view worker);

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_AGENT_SUPPORT_H_
