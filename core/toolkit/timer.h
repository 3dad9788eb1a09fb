// TimerQueue: runs callbacks at deadlines on one thread of its own.
//
// Agents use it, through PendingRequests (pending_requests.h), to bound
// every request they send (a pending request fails with DEADLINE_EXCEEDED
// when its timer fires first). Callbacks run on the timer thread, never
// inline in schedule(); they must not block.
//
// Thread safety: all methods may be called from any thread. The destructor
// drops the callbacks that have not run and joins the thread; called from
// one of the queue's own callbacks (its owner went there), it lets the
// thread end by itself once that callback returns.
#ifndef TETHER_CORE_TOOLKIT_TIMER_H_
#define TETHER_CORE_TOOLKIT_TIMER_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>

namespace tether::internal {

class TimerQueue {
 public:
  using Id = uint64_t;

  // `owner` (any address that stands for the owner) marks the timer thread:
  // see running_owner().
  explicit TimerQueue(const void* owner = nullptr);
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at `deadline` unless cancelled first. An infinite deadline
  // schedules nothing and returns 0.
  Id schedule(absl::Time deadline, std::function<void()> fn);

  // Returns true if the timer was pending and will not run.
  bool cancel(Id id);

  // On a queue's thread (in its callbacks), that queue's owner; elsewhere
  // nullptr. An owner that must not join its timer thread from that thread
  // (a callback may end up shutting it down) checks this; its own address
  // is still there to compare with once it has handed the queue off.
  static const void* running_owner();

 private:
  // What the thread shares with the queue: it outlives a queue destroyed
  // on its own thread.
  struct State {
    absl::Mutex mu;
    bool stopping ABSL_GUARDED_BY(mu) = false;
    Id next_id ABSL_GUARDED_BY(mu) = 1;
    uint64_t generation ABSL_GUARDED_BY(mu) = 0;
    // When the thread wakes next by itself (it waits with this deadline).
    absl::Time sleeping_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    // Keyed by (deadline, id) so equal deadlines keep their order.
    std::map<std::pair<absl::Time, Id>, std::function<void()>> timers
        ABSL_GUARDED_BY(mu);
    // A call's timer is added and cancelled on every call: a flat table
    // takes no allocation per timer, as a tree's node would.
    absl::flat_hash_map<Id, absl::Time> deadlines ABSL_GUARDED_BY(mu);
  };

  static void run(const std::shared_ptr<State>& state, const void* owner);

  const void* const owner_;
  const std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_TIMER_H_
