#include "backends/loopback/loopback_agent.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/thread_pool.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/common/refusals.h"
#include "core/toolkit/check.h"
#include "core/toolkit/pending_requests.h"
#include "core/toolkit/timer.h"

namespace tether::backends {
namespace {

class Endpoint;

// The agents of one group: who is there, and the group-wide in-flight count
// that join() waits on.
class Hub {
 public:
  static std::shared_ptr<Hub> get(const std::string& key, int world_size) {
    static absl::Mutex mu(absl::kConstInit);
    static auto* hubs = new absl::flat_hash_map<std::string, std::weak_ptr<Hub>>;
    absl::MutexLock lock(&mu);
    std::shared_ptr<Hub> hub = (*hubs)[key].lock();
    if (hub == nullptr) {
      hub = std::make_shared<Hub>(world_size);
      (*hubs)[key] = hub;
    }
    return hub;
  }

  explicit Hub(int world_size) : world_size_(world_size) {}

  void add(const std::string& name, std::shared_ptr<Endpoint> endpoint) {
    absl::MutexLock lock(&mu_);
    endpoints_[name] = std::move(endpoint);
  }

  void remove(const std::string& name) {
    absl::MutexLock lock(&mu_);
    endpoints_.erase(name);
  }

  std::shared_ptr<Endpoint> find(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(name);
    return it == endpoints_.end() ? nullptr : it->second;
  }

  void request_started() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }

  void request_finished() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }

  absl::Status join(const std::string& name, absl::Duration timeout,
                    const std::function<void()>& all_joined) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    joined_.insert(name);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(joined_.size()) >= world_size_;
    };
    // Drained once every worker has run its all_joined (what it sent is in
    // flight by then) and nothing is in flight.
    auto drained = [this, &all]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return all() && static_cast<int>(hooked_.size()) >= world_size_ &&
             in_flight_ == 0;
    };
    if (all_joined && mu_.AwaitWithDeadline(absl::Condition(&all), deadline)) {
      mu_.Unlock();
      all_joined();
      mu_.Lock();
    }
    hooked_.insert(name);
    if (mu_.AwaitWithDeadline(absl::Condition(&drained), deadline)) {
      return absl::OkStatus();
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "join timed out after ", absl::FormatDuration(timeout), ": ",
        joined_.size(), " of ", world_size_, " workers joined, ", in_flight_,
        " requests in flight"));
  }

 private:
  const int world_size_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Endpoint>> endpoints_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> joined_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> hooked_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// Copies every storage, as a wire would.
Message copy_message(const Message& message) {
  Message copy;
  copy.type = message.type;
  copy.id = message.id;
  copy.payload = message.payload;
  copy.storages.reserve(message.storages.size());
  for (const c10::Storage& storage : message.storages) {
    c10::Storage fresh(c10::Storage::use_byte_size_t(), storage.nbytes(),
                       c10::GetCPUAllocator(), /*resizable=*/false);
    if (storage.nbytes() > 0) {
      std::memcpy(fresh.data(), storage.data(), storage.nbytes());
    }
    copy.storages.push_back(std::move(fresh));
  }
  return copy;
}

// RESOURCE_EXHAUSTED if worker `receiver` (whose limits are `limits`) may
// not take `message`.
absl::Status check_limits(const Message& message, const MessageLimits& limits,
                          absl::string_view receiver) {
  std::vector<uint64_t> storage_bytes;
  storage_bytes.reserve(message.storages.size());
  for (const c10::Storage& storage : message.storages) {
    storage_bytes.push_back(storage.nbytes());
  }
  absl::Status within =
      check_message_limits(message.payload.size(), storage_bytes, limits);
  if (within.ok()) return within;
  return absl::Status(within.code(),
                      absl::StrCat("worker '", receiver, "' refuses a ",
                                   message_type_name(message.type), ": ",
                                   within.message()));
}

// One agent's state that peers reach: it outlives the agent while a peer
// still holds it, and refuses work once closed.
class Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  // `loop` and `timers` belong to the agent and are used only while the
  // endpoint is open (the agent closes it before destroying them).
  Endpoint(WorkerInfo self, MessageLimits limits, std::shared_ptr<Hub> hub,
           c10::ThreadPool* loop, internal::TimerQueue* timers)
      : self_(std::move(self)),
        limits_(limits),
        hub_(std::move(hub)),
        loop_(loop),
        pending_(timers) {}

  const WorkerInfo& self() const { return self_; }
  Hub& hub() { return *hub_; }

  void set_handler(RequestHandler handler) {
    absl::MutexLock lock(&mu_);
    handler_ = std::move(handler);
  }

  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout) {
    std::shared_ptr<Endpoint> target = hub_->find(to.name);
    absl::StatusOr<internal::PendingRequests::Request> pending;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) {
        return common::refused(
            common::sent_after_shutdown(self_.name, request.type, to.name));
      }
      if (target == nullptr) {
        return common::refused(common::not_in_group(self_.name, to.name));
      }
      // Under mu_, so that close() fails it.
      pending = pending_.add(timeout, request.type, to.name);
    }
    if (!pending.ok()) return common::refused(pending.status());
    const int64_t id = pending->id;
    request.id = id;
    hub_->request_started();
    // The callee's limits, checked before its copy is made, as a transport
    // checks the sizes a peer announces before it allocates.
    if (absl::Status within = check_limits(request, target->limits_, to.name);
        !within.ok()) {
      deliver_response(id, std::move(within));
      return std::move(pending->response);
    }
    auto copy = std::make_shared<Message>(copy_message(request));
    std::shared_ptr<Endpoint> sender = shared_from_this();
    bool posted = target->post([target, sender, copy]() mutable {
      target->handle_request(std::move(sender), std::move(*copy));
    });
    if (!posted) {
      deliver_response(id, absl::UnavailableError(absl::StrCat(
                               "worker '", to.name, "' has shut down")));
    }
    return std::move(pending->response);
  }

  void close() {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
    }
    hub_->remove(self_.name);
    pending_.cancel_all(common::shut_down_with_request_pending(self_.name));
  }

 private:
  // Runs `fn` on this endpoint's loop; false once closed.
  bool post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    loop_->run(std::move(fn));
    return true;
  }

  // On this endpoint's loop thread.
  void handle_request(std::shared_ptr<Endpoint> sender, Message request) {
    RequestHandler handler;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) handler = handler_;
    }
    const int64_t id = request.id;
    if (!handler) {
      sender->deliver_response(
          id, absl::UnavailableError(absl::StrCat(
                  "worker '", self_.name, "' is not serving requests")));
      return;
    }
    Future<Message> response = handler(std::move(request));
    response.on_complete(
        [sender, id](const absl::StatusOr<Message>& result) {
          if (!result.ok()) {
            sender->deliver_response(id, result.status());
            return;
          }
          // The caller's limits, before its copy is made.
          if (absl::Status within =
                  check_limits(*result, sender->limits_, sender->self_.name);
              !within.ok()) {
            sender->deliver_response(id, std::move(within));
            return;
          }
          Message copy = copy_message(*result);
          copy.id = id;
          sender->deliver_response(id, std::move(copy));
        });
  }

  void deliver_response(int64_t id, absl::StatusOr<Message> response) {
    auto shared = std::make_shared<absl::StatusOr<Message>>(std::move(response));
    std::shared_ptr<Endpoint> self = shared_from_this();
    bool posted = post([self, id, shared] {
      // Complete first: a join released by the count must find the
      // response delivered, not a request to cancel.
      self->pending_.complete(id, std::move(*shared));
      self->hub_->request_finished();
    });
    // A closed endpoint already failed its pending requests.
    if (!posted) hub_->request_finished();
  }

  const WorkerInfo self_;
  // What this endpoint takes in one request (AgentSetup::limits).
  const MessageLimits limits_;
  const std::shared_ptr<Hub> hub_;
  absl::Mutex mu_;
  RequestHandler handler_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  c10::ThreadPool* const loop_;
  internal::PendingRequests pending_;
};

class LoopbackAgent final : public Agent {
 public:
  explicit LoopbackAgent(AgentSetup setup)
      : workers_(std::move(setup.workers)),
        dynamic_(setup.dynamic),
        endpoint_(std::make_shared<Endpoint>(
            setup.self, setup.limits,
            Hub::get(setup.group_key, static_cast<int>(workers_.size())),
            &loop_, &timers_)) {}

  ~LoopbackAgent() override {
    shutdown();
    // Tasks already queued finish (they see the endpoint closed); peers and
    // timers may keep the endpoint itself alive a little longer, harmlessly.
    loop_.waitWorkComplete();
  }

  absl::Status start(RequestHandler handler) override {
    endpoint_->set_handler(std::move(handler));
    endpoint_->hub().add(endpoint_->self().name, endpoint_);
    return absl::OkStatus();
  }

  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout) override {
    return endpoint_->send(to, std::move(request), timeout);
  }

  const WorkerInfo& self() const override { return endpoint_->self(); }

  const std::vector<WorkerInfo>& worker_infos() const override {
    return workers_;
  }

  absl::Status join(absl::Duration timeout,
                    const std::function<void()>& all_joined = {}) override {
    return endpoint_->hub().join(endpoint_->self().name, timeout, all_joined);
  }

  // The hub reaches every started agent of the group by name: a joiner is
  // there before it tells anyone, and a leaver until it shuts down.
  absl::Status add_peer(const WorkerInfo& worker) override {
    if (dynamic_) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "loopback agent of worker '", endpoint_->self().name,
        "' is in a static group: worker '", worker.name, "' cannot join it"));
  }
  void remove_peer(const WorkerInfo& /*worker*/) override {}

  // After close() no handler call starts; waiting for the loop (unless this
  // is the loop) lets a handler call in progress finish before we return.
  void shutdown() override {
    endpoint_->close();
    if (!loop_.inThreadPool()) loop_.waitWorkComplete();
  }

 private:
  // The loop and the timers are declared first so they outlive the
  // endpoint's use of them.
  c10::ThreadPool loop_{1};
  internal::TimerQueue timers_;
  const std::vector<WorkerInfo> workers_;
  const bool dynamic_;
  const std::shared_ptr<Endpoint> endpoint_;
};

}  // namespace

Backend loopback_backend() {
  Backend backend;
  backend.name = "loopback";
  backend.viable = [] { return absl::OkStatus(); };
  backend.create =
      [](AgentSetup setup) -> absl::StatusOr<std::unique_ptr<Agent>> {
    return std::make_unique<LoopbackAgent>(std::move(setup));
  };
  return backend;
}

}  // namespace tether::backends
