#include "backends/libfabric/internal/agent_state.h"

#include <absl/synchronization/notification.h>
#include <c10/core/Device.h>
#include <unistd.h>

namespace tether::backends::libfabric::internal {

namespace {

// How long a call_on_progress_thread() caller waits.
constexpr absl::Duration kCallBound = absl::Seconds(10);

}  // namespace

bool AgentState::post(std::function<void()> command) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    commands_.push_back(std::move(command));
  }
  wake();
  return true;
}

absl::Status AgentState::call_on_progress_thread(std::function<void()> command,
                                            absl::string_view doing) {
  if (on_own_thread()) {  // an assisting thread, which holds the token
    command();
    return absl::OkStatus();
  }
  auto done = std::make_shared<absl::Notification>();
  if (!post([command = std::move(command), done] {
        command();
        done->Notify();
      })) {
    return absl::CancelledError(
        absl::StrCat("worker '", self_.name, "' has shut down"));
  }
  if (!done->WaitForNotificationWithTimeout(kCallBound)) {
    return absl::DeadlineExceededError(
        absl::StrCat(who(), " did not ", doing, " within ",
                     absl::FormatDuration(kCallBound)));
  }
  return absl::OkStatus();
}

void AgentState::wake() {
  // Pairs with idle(): it sets sleeping_ before it looks at commands_ for
  // the last time, and we look at sleeping_ after adding to commands_.
  if (!sleeping_.load()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t written = ::write(event_fd_, &one, sizeof(one));
}

bool AgentState::has_commands() {
  absl::MutexLock lock(&mu_);
  return !commands_.empty() || closed_;
}

void AgentState::take_resources(Resources& out) {
  out.progress = std::move(progress_);
  out.commands.swap(commands_);
}

void AgentState::close_resources(Resources& /*resources*/) {
  if (event_fd_ < 0) return;  // init() failed before the thread
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t written = ::write(event_fd_, &one, sizeof(one));
}

void AgentState::join_resources(Resources& resources) {
  if (resources.progress.joinable()) resources.progress.join();
}

Future<Message> AgentState::start_send(const common::Peer& peer, Message request,
                                  PendingRequests::Request pending) {
  for (const c10::Storage& storage : request.storages) {
    if (!storage.device().is_cpu()) {
      fail_later(pending.id,
                 absl::InvalidArgumentError(absl::StrCat(
                     "the libfabric backend moves CPU storages only; a ",
                     message_type_name(request.type), " to worker '",
                     peer.info.name, "' has one on ", storage.device().str())));
      return std::move(pending.response);
    }
  }
  const bool assisted = cq_fd_ >= 0 && !on_own_thread();
  // Sent from this thread when it can go at once (progress.cc), else by the
  // progress thread; once shut down, shutdown() fails it.
  if (!assisted || !send_directly(peer.info.id, pending.id, request)) {
    post([this, rank = peer.info.id, id = pending.id,
          request = std::move(request)]() mutable {
      start_request(rank, id, std::move(request));
    });
  }
  // If this thread now waits for the answer, it reads the completion queue
  // itself (the assist; progress.cc).
  if (assisted) common::arm_fd_assist(weak_from_this());
  return std::move(pending.response);
}

void AgentState::send_response(int rank, int64_t id,
                          const absl::StatusOr<Message>& result) {
  auto shared = std::make_shared<absl::StatusOr<Message>>(result);
  if (!post([this, rank, id, shared] { respond(rank, id, *shared); })) {
    incoming_.answered();  // shut down: the response is dropped
  }
}

void AgentState::run_deferred_later(Incoming::Deferred deferred) {
  auto shared = std::make_shared<Incoming::Deferred>(std::move(deferred));
  post([this, shared] { incoming_.run_deferred(std::move(*shared)); });
}

absl::StatusOr<std::optional<Endpoint>> AgentState::endpoint_of(
    const WorkerInfo& worker) const {
  // The skeleton's answers whether `worker` is in the group and published;
  // it finds no host:port in a record, which is read here.
  absl::StatusOr<std::optional<Endpoint>> known =
      AgentSkeleton::endpoint_of(worker);
  if (!known.ok()) return known.status();
  absl::StatusOr<std::string> published = common::lookup_address(
      *store_, names_.address_key_prefix, worker, who());
  if (!published.ok()) return published.status();
  absl::StatusOr<Record> record = decode_record(*published);
  if (!record.ok()) {
    return absl::UnavailableError(
        absl::StrCat(who(), ": the record worker '", worker.name,
                     "' published: ", record.status().message()));
  }
  return endpoint_in_record(*record);
}

absl::StatusOr<LibfabricStats> AgentState::stats() {
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
