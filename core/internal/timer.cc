#include "core/internal/timer.h"

namespace tether::internal {
namespace {

thread_local const void* t_running_owner = nullptr;

}  // namespace

TimerQueue::TimerQueue(const void* owner)
    : owner_(owner), thread_([this] { run(); }) {}

const void* TimerQueue::running_owner() { return t_running_owner; }

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

TimerQueue::Id TimerQueue::schedule(absl::Time deadline,
                                    std::function<void()> fn) {
  if (deadline == absl::InfiniteFuture()) return 0;
  absl::MutexLock lock(&mu_);
  Id id = next_id_++;
  // The thread wakes by itself at sleeping_until_ and looks again; only an
  // earlier deadline needs it now. (Cancelled timers leave sleeping_until_
  // stale: the thread then wakes once for nothing. A call's timer is
  // scheduled and cancelled on every call, and waking the timer thread for
  // each was a context switch on the caller's path.)
  if (deadline < sleeping_until_) ++generation_;
  timers_.emplace(std::make_pair(deadline, id), std::move(fn));
  deadlines_.emplace(id, deadline);
  return id;
}

bool TimerQueue::cancel(Id id) {
  absl::MutexLock lock(&mu_);
  auto it = deadlines_.find(id);
  if (it == deadlines_.end()) return false;
  timers_.erase(std::make_pair(it->second, id));
  deadlines_.erase(it);
  return true;
}

void TimerQueue::run() {
  t_running_owner = owner_;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    absl::Time next = timers_.empty() ? absl::InfiniteFuture()
                                      : timers_.begin()->first.first;
    if (absl::Now() < next) {
      // Wakes at the earliest deadline, at shutdown, or when a timer is
      // added (it may be earlier than `next`).
      sleeping_until_ = next;
      const uint64_t generation = generation_;
      auto changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || generation_ != generation;
      };
      mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      continue;
    }
    auto it = timers_.begin();
    std::function<void()> fn = std::move(it->second);
    deadlines_.erase(it->first.second);
    timers_.erase(it);
    mu_.Unlock();
    fn();
    mu_.Lock();
  }
}

}  // namespace tether::internal
