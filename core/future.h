// Future<T> and Promise<T>: the one-shot asynchronous result of tether.
//
// Every asynchronous operation (an Agent's send, rpc_async, remote) hands back
// a Future that completes exactly once with a value or an error Status. The
// producer holds the Promise; both share one reference-counted state, so
// pending work outlives the user's handle.
//
// Thread safety: every method may be called from any thread.
//
// Callbacks: `on_complete` and `then` callbacks run exactly once. If the
// future is pending they run on the thread that completes it, after the
// internal lock is released; a completer never holds a lock of its own while
// completing (docs/architecture.md section 8), so a callback never runs
// under a caller's lock. If the future is already complete, the callback
// runs at once on the calling thread. Callbacks must not block.
//
// A thread that waits may run the backend's work itself (internal::
// WaitAssist): the callbacks of other futures the answers it reads complete
// then run on it, as they would on the backend's thread. Hold no lock that
// a callback takes while you wait (such a callback would block the backend
// either way).
#ifndef TETHER_CORE_FUTURE_H_
#define TETHER_CORE_FUTURE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/inlined_vector.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include "core/toolkit/check.h"
#include "core/toolkit/poll_policy.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace tether {

template <typename T>
class Future;

namespace internal {

// How a thread that waits for a future polls its result before it sleeps
// (RpcOptions::busy_poll and spare_core_poll), process-wide: the longest
// window any worker of the process asked for, on spare cores only unless
// one asked to poll regardless (toolkit/poll_policy.h).
inline std::atomic<int64_t> wait_poll_ns{0};
inline std::atomic<bool> wait_poll_regardless{false};

// Makes waits poll as `policy` says, or longer.
inline void poll_waits_with(const PollPolicy& policy) {
  const int64_t ns = absl::ToInt64Nanoseconds(policy.window);
  if (ns <= 0) return;
  if (!policy.only_on_spare_cores) wait_poll_regardless.store(true);
  int64_t now = wait_poll_ns.load();
  while (ns > now && !wait_poll_ns.compare_exchange_weak(now, ns)) {
  }
}

// Set on a thread whose waits are not latency-critical (SleepingWaits).
inline thread_local bool waits_sleep = false;

// The policy of waits on this thread: the process's, or none under
// SleepingWaits.
inline PollPolicy wait_poll_policy() {
  if (waits_sleep) return PollPolicy{};
  return PollPolicy{
      absl::Nanoseconds(wait_poll_ns.load(std::memory_order_relaxed)),
      !wait_poll_regardless.load(std::memory_order_relaxed)};
}

// Waits sleep at once again (tests that asked for polling, when they end).
inline void reset_wait_polling() {
  wait_poll_ns.store(0);
  wait_poll_regardless.store(false);
}

// While it lives, the waits of this thread sleep at once whatever the
// process's policy: for waits whose answer nobody is in a hurry for, such
// as a join's liveness probes, where polling would only spend a core. Both
// a future's wait and the backend's assist (WaitAssist, which reads the
// policy through wait_poll_policy()) sleep; the assist still saves its
// thread hand-off. Nests.
class SleepingWaits {
 public:
  SleepingWaits() : before_(std::exchange(waits_sleep, true)) {}
  ~SleepingWaits() { waits_sleep = before_; }
  SleepingWaits(const SleepingWaits&) = delete;
  SleepingWaits& operator=(const SleepingWaits&) = delete;

 private:
  const bool before_;
};

// A backend's offer to a thread that is about to wait for a future: rather
// than sleep until the backend's own thread has handled the answer and wakes
// it, the waiting thread waits for the answer's bytes itself and handles
// them where it is. That saves a thread hand-off (a wake-up, on this
// machine's virtual cores the most costly step of a small call:
// docs/benchmarks.md) per call. A backend arms it on the thread that has
// just sent a request (wait_assist below); the next wait for a pending
// future on that thread takes it, whatever the future.
class WaitAssist {
 public:
  virtual ~WaitAssist() = default;
  // On the waiting thread: returns once `done` is set, at `deadline`, after
  // wake(), or when it cannot help any longer (the thread then waits as
  // usual).
  virtual void wait(const std::atomic<bool>& done, absl::Time deadline) = 0;
  // From any thread, during wait(): makes it return soon.
  virtual void wake() = 0;
  // On the waiting thread, once no wake() can come for this wait.
  virtual void settle() = 0;
};

// Armed on this thread by a backend; taken by the next wait.
inline thread_local WaitAssist* wait_assist = nullptr;

// True while this thread is in WaitAssist::wait: it may handle a request
// that arrives meanwhile, on a user's thread in the middle of its own work
// (the Worker serves it as on a fresh thread: core/worker.cc).
inline thread_local bool in_wait_assist = false;

template <typename T>
class FutureState {
 public:
  using Callback = std::function<void(const absl::StatusOr<T>&)>;

  // Returns false if the state was already complete (the value is dropped).
  bool complete(absl::StatusOr<T> result) {
    Callbacks callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (result_.has_value()) return false;
      result_.emplace(std::move(result));
      done_.store(true, std::memory_order_release);
      callbacks.swap(callbacks_);
      // Under the lock: the waiter clears it under the lock before its
      // assist can go away.
      if (assisted_by_ != nullptr) assisted_by_->wake();
    }
    // result_ is immutable from here on: callbacks read it without the lock.
    for (Callback& callback : callbacks) callback(*result_);
    return true;
  }

  void add_callback(Callback callback) {
    {
      absl::MutexLock lock(&mu_);
      if (!result_.has_value()) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    callback(*result_);
  }

  bool is_ready() const {
    absl::MutexLock lock(&mu_);
    return result_.has_value();
  }

  // Returns true if complete by `deadline`.
  bool wait_until(absl::Time deadline) const {
    if (WaitAssist* assist = std::exchange(wait_assist, nullptr);
        assist != nullptr && !done_.load(std::memory_order_acquire)) {
      bool assisting = false;
      {
        absl::MutexLock lock(&mu_);
        // One assisted waiter per future; others wait as usual.
        if (!result_.has_value() && assisted_by_ == nullptr) {
          assisted_by_ = assist;
          assisting = true;
        }
      }
      if (assisting) {
        in_wait_assist = true;
        assist->wait(done_, deadline);
        in_wait_assist = false;
        {
          absl::MutexLock lock(&mu_);
          assisted_by_ = nullptr;
        }
        assist->settle();
      }
    }
    // Polls first, yielding the core between looks, if waits may: a thread
    // that is running needs no wake-up when the result comes.
    if (!done_.load(std::memory_order_acquire)) {
      PollWindow window(wait_poll_policy());
      if (window.enabled()) {
        window.worked();
        while (!done_.load(std::memory_order_acquire) &&
               absl::Now() < deadline && window.keep_polling()) {
        }
      }
    }
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return result_.has_value();
    };
    return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  }

  // Only after completion.
  const absl::StatusOr<T>& result() const { return *result_; }

 private:
  mutable absl::Mutex mu_;
  std::optional<absl::StatusOr<T>> result_ ABSL_GUARDED_BY(mu_);
  // Set with result_, for waits that poll without the lock.
  std::atomic<bool> done_{false};
  // A future mostly has one callback (a `then`, or its agent's answer):
  // held inline, it costs no allocation.
  using Callbacks = absl::InlinedVector<Callback, 1>;
  Callbacks callbacks_ ABSL_GUARDED_BY(mu_);
  // The assist of the thread waiting through one (WaitAssist), if any.
  mutable WaitAssist* assisted_by_ ABSL_GUARDED_BY(mu_) = nullptr;
};

template <typename T>
struct UnwrapStatusOr {
  using type = T;
};
template <typename T>
struct UnwrapStatusOr<absl::StatusOr<T>> {
  using type = T;
};

}  // namespace internal

template <typename T>
class Future {
 public:
  using ValueType = T;

  // An invalid future; only assignment and valid() may be used on it.
  Future() = default;

  // A future that is already complete.
  static Future ready(absl::StatusOr<T> result) {
    auto state = std::make_shared<internal::FutureState<T>>();
    state->complete(std::move(result));
    return Future(std::move(state));
  }

  bool valid() const { return state_ != nullptr; }
  bool is_ready() const { return state_->is_ready(); }

  // Blocks until complete or until `deadline`; DEADLINE_EXCEEDED if the
  // deadline came first (the future stays pending).
  [[nodiscard]] absl::Status wait(absl::Time deadline) const {
    if (state_->wait_until(deadline)) return absl::OkStatus();
    return absl::DeadlineExceededError("timed out waiting for a future");
  }

  // Blocks until complete (or `deadline`) and returns a copy of the result.
  [[nodiscard]] absl::StatusOr<T> get(
      absl::Time deadline = absl::InfiniteFuture()) const {
    absl::Status waited = wait(deadline);
    if (!waited.ok()) return waited;
    return state_->result();
  }

  // The result of a complete future; a CHECK failure if still pending.
  const absl::StatusOr<T>& result() const;

  void on_complete(std::function<void(const absl::StatusOr<T>&)> callback) {
    state_->add_callback(std::move(callback));
  }

  // Chains `fn(const StatusOr<T>&)`, which returns U or StatusOr<U>, and
  // hands back a Future<U> of its result.
  template <typename F,
            typename R = std::invoke_result_t<F, const absl::StatusOr<T>&>,
            typename U = typename internal::UnwrapStatusOr<R>::type>
  Future<U> then(F fn) {
    auto next = std::make_shared<internal::FutureState<U>>();
    state_->add_callback([next, fn = std::move(fn)](
                             const absl::StatusOr<T>& result) mutable {
      next->complete(absl::StatusOr<U>(fn(result)));
    });
    return Future<U>(next);
  }

 private:
  template <typename>
  friend class Promise;
  template <typename>
  friend class Future;

  explicit Future(std::shared_ptr<internal::FutureState<T>> state)
      : state_(std::move(state)) {}

  std::shared_ptr<internal::FutureState<T>> state_;
};

template <typename T>
const absl::StatusOr<T>& Future<T>::result() const {
  TETHER_CHECK(state_->is_ready(), "Future::result() on a pending future");
  return state_->result();
}

// The producing side of a Future. Copyable: copies complete the same future.
template <typename T>
class Promise {
 public:
  Promise() : state_(std::make_shared<internal::FutureState<T>>()) {}

  Future<T> future() const { return Future<T>(state_); }

  // Completes the future; returns false (and drops `result`) if it was
  // already complete, so a response racing a timeout is harmless.
  bool set(absl::StatusOr<T> result) const {
    return state_->complete(std::move(result));
  }

  bool is_set() const { return state_->is_ready(); }

 private:
  std::shared_ptr<internal::FutureState<T>> state_;
};

// A future that completes once every one of `futures` has, with their
// results in order, errors included (torch.futures.collect_all). Its
// callbacks run on the thread that completes the last of them.
template <typename T>
Future<std::vector<absl::StatusOr<T>>> collect_all(
    const std::vector<Future<T>>& futures) {
  using Results = std::vector<absl::StatusOr<T>>;
  Promise<Results> promise;
  if (futures.empty()) {
    promise.set(Results{});
    return promise.future();
  }
  struct Gather {
    absl::Mutex mu;
    Results results ABSL_GUARDED_BY(mu);
    size_t left ABSL_GUARDED_BY(mu);
  };
  auto gather = std::make_shared<Gather>();
  {
    absl::MutexLock lock(&gather->mu);
    gather->results.assign(futures.size(),
                           absl::UnknownError("not complete"));
    gather->left = futures.size();
  }
  for (size_t i = 0; i < futures.size(); ++i) {
    Future<T> future = futures[i];
    future.on_complete([gather, promise, i](const absl::StatusOr<T>& result) {
      Results done;
      {
        absl::MutexLock lock(&gather->mu);
        gather->results[i] = result;
        if (--gather->left > 0) return;
        done.swap(gather->results);
      }
      promise.set(std::move(done));
    });
  }
  return promise.future();
}

// Blocks until every one of `futures` is complete and returns their values
// in order, or the first error among them (in order) once all are complete
// (torch.futures.wait_all). DEADLINE_EXCEEDED if `deadline` comes first.
template <typename T>
[[nodiscard]] absl::StatusOr<std::vector<T>> wait_all(
    const std::vector<Future<T>>& futures,
    absl::Time deadline = absl::InfiniteFuture()) {
  absl::StatusOr<std::vector<absl::StatusOr<T>>> all =
      collect_all(futures).get(deadline);
  if (!all.ok()) return all.status();
  std::vector<T> values;
  values.reserve(all->size());
  for (absl::StatusOr<T>& result : *all) {
    if (!result.ok()) return result.status();
    values.push_back(*std::move(result));
  }
  return values;
}

}  // namespace tether

#endif  // TETHER_CORE_FUTURE_H_
