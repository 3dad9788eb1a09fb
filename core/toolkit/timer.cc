#include "core/toolkit/timer.h"

namespace tether::internal {
namespace {

thread_local const void* t_running_owner = nullptr;

}  // namespace

TimerQueue::TimerQueue(const void* owner)
    : owner_(owner),
      state_(std::make_shared<State>()),
      thread_([state = state_, owner] { run(state, owner); }) {}

const void* TimerQueue::running_owner() { return t_running_owner; }

TimerQueue::~TimerQueue() {
  std::map<std::pair<absl::Time, Id>, std::function<void()>> dropped;
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    dropped.swap(state_->timers);
    state_->deadlines.clear();
  }
  dropped.clear();  // outside the lock: a callback's captures may call back
  if (thread_.get_id() == std::this_thread::get_id()) {
    // In one of our callbacks: the thread holds the state, and ends when
    // that callback returns.
    thread_.detach();
  } else {
    thread_.join();
  }
}

TimerQueue::Id TimerQueue::schedule(absl::Time deadline,
                                    std::function<void()> fn) {
  if (deadline == absl::InfiniteFuture()) return 0;
  State& state = *state_;
  absl::MutexLock lock(&state.mu);
  Id id = state.next_id++;
  // The thread wakes by itself at sleeping_until and looks again; only an
  // earlier deadline needs it now. (Cancelled timers leave sleeping_until
  // stale: the thread then wakes once for nothing. A call's timer is
  // scheduled and cancelled on every call, and waking the timer thread for
  // each was a context switch on the caller's path.)
  if (deadline < state.sleeping_until) ++state.generation;
  state.timers.emplace(std::make_pair(deadline, id), std::move(fn));
  state.deadlines.emplace(id, deadline);
  return id;
}

bool TimerQueue::cancel(Id id) {
  State& state = *state_;
  absl::MutexLock lock(&state.mu);
  auto it = state.deadlines.find(id);
  if (it == state.deadlines.end()) return false;
  state.timers.erase(std::make_pair(it->second, id));
  state.deadlines.erase(it);
  return true;
}

void TimerQueue::run(const std::shared_ptr<State>& shared, const void* owner) {
  t_running_owner = owner;
  State& state = *shared;
  absl::MutexLock lock(&state.mu);
  while (!state.stopping) {
    absl::Time next = state.timers.empty() ? absl::InfiniteFuture()
                                           : state.timers.begin()->first.first;
    if (absl::Now() < next) {
      // Wakes at the earliest deadline, at shutdown, or when a timer is
      // added (it may be earlier than `next`).
      state.sleeping_until = next;
      const uint64_t generation = state.generation;
      auto changed = [&state, generation]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
                           return state.stopping ||
                                  state.generation != generation;
                         };
      state.mu.AwaitWithDeadline(absl::Condition(&changed), next);
      continue;
    }
    auto it = state.timers.begin();
    std::function<void()> fn = std::move(it->second);
    state.deadlines.erase(it->first.second);
    state.timers.erase(it);
    state.mu.Unlock();
    fn();
    fn = nullptr;  // its captures go before the lock is taken again
    state.mu.Lock();
  }
}

}  // namespace tether::internal
