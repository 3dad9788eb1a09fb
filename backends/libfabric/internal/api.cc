#include "backends/libfabric/internal/agent_state.h"

#include <absl/synchronization/notification.h>
#include <c10/core/Device.h>
#include <unistd.h>

#include "backends/common/refusals.h"

namespace tether::backends::libfabric::internal {

namespace {

// How long a call_on_progress_thread() caller waits.
constexpr absl::Duration kCallBound = absl::Seconds(10);

}  // namespace

absl::Status State::start(RequestHandler handler) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return absl::CancelledError(
          absl::StrCat("worker '", self_.name, "' has shut down"));
    }
    if (handler_ != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("start() called twice on worker '", self_.name, "'"));
    }
    handler_ = std::make_shared<const RequestHandler>(std::move(handler));
  }
  // After what the progress thread is doing now, which may defer one more.
  post([this] { serve_deferred(); });
  return absl::OkStatus();
}

bool State::post(std::function<void()> command) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    commands_.push_back(std::move(command));
  }
  wake();
  return true;
}

absl::Status State::call_on_progress_thread(std::function<void()> command,
                                            absl::string_view doing) {
  auto done = std::make_shared<absl::Notification>();
  if (!post([command = std::move(command), done] {
        command();
        done->Notify();
      })) {
    return absl::CancelledError(
        absl::StrCat("worker '", self_.name, "' has shut down"));
  }
  if (!done->WaitForNotificationWithTimeout(kCallBound)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "libfabric agent of worker '", self_.name, "' did not ", doing,
        " within ", absl::FormatDuration(kCallBound)));
  }
  return absl::OkStatus();
}

void State::wake() {
  // Pairs with idle(): it sets sleeping_ before it looks at commands_ for
  // the last time, and we look at sleeping_ after adding to commands_.
  if (!sleeping_.load()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t written = ::write(event_fd_, &one, sizeof(one));
}

bool State::has_commands() {
  absl::MutexLock lock(&mu_);
  return !commands_.empty() || closed_;
}

void State::finish_handling() {
  absl::MutexLock lock(&mu_);
  --incoming_active_;
}

Future<Message> State::send(const WorkerInfo& to, Message request,
                            absl::Duration timeout) {
  int rank = -1;
  {
    absl::MutexLock lock(&names_mu_);
    auto peer = rank_by_name_.find(to.name);
    if (peer != rank_by_name_.end()) rank = peer->second;
  }
  if (rank < 0) {
    return common::refused(absl::UnavailableError(
        absl::StrCat("worker '", to.name, "' is not in the group of worker '",
                     self_.name, "'")));
  }
  for (const c10::Storage& storage : request.storages) {
    if (!storage.device().is_cpu()) {
      return common::refused(absl::InvalidArgumentError(absl::StrCat(
          "the libfabric backend moves CPU storages only; a ",
          message_type_name(request.type), " to worker '", to.name,
          "' has one on ", storage.device().str())));
    }
  }
  absl::StatusOr<PendingRequests::Request> pending;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return common::refused(
          common::sent_after_shutdown(self_.name, request.type, to.name));
    }
    // Under mu_, so that shutdown() fails it.
    pending = pending_.add(timeout,
                           absl::StrCat(message_type_name(request.type),
                                        " request to worker '", to.name, "'"));
    if (pending.ok()) {
      commands_.push_back(
          [this, rank, id = pending->id, request = std::move(request)]() mutable {
            start_request(rank, id, std::move(request));
          });
    }
  }
  if (!pending.ok()) return common::refused(pending.status());
  wake();
  return std::move(pending->response);
}

absl::Status State::join(absl::Duration timeout) {
  return common::join_agent(
      joiner_, pending_,
      [this] {
        absl::MutexLock lock(&mu_);
        return incoming_active_;
      },
      [this] {
        absl::MutexLock lock(&mu_);
        return closed_;
      },
      self_.name, timeout, common::liveness_of(this, peer_timeout_));
}

void State::shutdown() {
  const bool on_own_thread =
      t_progress_of == this || TimerQueue::running_owner() == this;
  if (!shutdown_.begin(on_own_thread)) return;
  // Joined (and destroyed) outside the lock: the handler, the deferred
  // requests and the commands may hold user objects.
  struct Resources {
    std::thread progress;
    std::unique_ptr<TimerQueue> timers;
    std::shared_ptr<const RequestHandler> handler;
    std::deque<std::function<void()>> commands;
  };
  auto resources = std::make_shared<Resources>();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    resources->progress = std::move(progress_);
    resources->timers = std::move(timers_);
    resources->handler = std::move(handler_);
    resources->commands.swap(commands_);
  }
  // Before the timers go.
  pending_.cancel_all(absl::CancelledError(absl::StrCat(
      "worker '", self_.name, "' shut down with the request pending")));
  // The progress thread sees closed_, says goodbye and closes the fabric.
  if (event_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t written = ::write(event_fd_, &one, sizeof(one));
  }
  shutdown_.finish(on_own_thread, [resources, self = shared_from_this()] {
    if (resources->progress.joinable()) resources->progress.join();
    resources->timers.reset();
  });
}

absl::StatusOr<LibfabricStats> State::stats() {
  auto result = std::make_shared<std::optional<LibfabricStats>>();
  absl::Status called = call_on_progress_thread(
      [this, result] {
        LibfabricStats stats = stats_;
        const MrCache::Stats cache = mr_cache_->stats();
        stats.mr_cache_hits = cache.hits;
        stats.mr_cache_misses = cache.misses;
        stats.mr_cache_evictions = cache.evictions;
        *result = std::move(stats);
      },
      "report its counters");
  if (!called.ok()) return called;
  return **result;
}

}  // namespace tether::backends::libfabric::internal
