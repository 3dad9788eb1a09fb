// TimerQueue: runs callbacks at deadlines on one thread of its own.
//
// Agents use it to bound every request they send (a pending request fails
// with DEADLINE_EXCEEDED when its timer fires first). Callbacks run on the
// timer thread, never inline in schedule(); they must not block.
//
// Thread safety: all methods may be called from any thread. The destructor
// drops the callbacks that have not run and joins the thread.
#ifndef TETHER_CORE_INTERNAL_TIMER_H_
#define TETHER_CORE_INTERNAL_TIMER_H_

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

namespace tether::internal {

class TimerQueue {
 public:
  using Id = uint64_t;

  TimerQueue();
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at `deadline` unless cancelled first. An infinite deadline
  // schedules nothing and returns 0.
  Id schedule(absl::Time deadline, std::function<void()> fn);

  // Returns true if the timer was pending and will not run.
  bool cancel(Id id);

 private:
  void run();

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Keyed by (deadline, id) so equal deadlines keep their order.
  std::map<std::pair<absl::Time, Id>, std::function<void()>> timers_
      ABSL_GUARDED_BY(mu_);
  std::map<Id, absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tether::internal

#endif  // TETHER_CORE_INTERNAL_TIMER_H_
