// SerialExecutor: one thread that runs posted tasks in order.
//
// Used by the backends for the work they keep off their callers' and their
// library's threads: the tensorpipe agent opens pipes from one, writes there
// what cannot be written from the caller's thread, and runs there the
// callbacks tensorpipe hands to a caller's thread (it borrows the calling
// thread to run its event loop); the gRPC agent
// delivers received messages on a few (so gRPC's shared callback threads only
// parse bytes and never run a request handler).
//
// Thread safety: post() from any thread. stop() once, from a thread other
// than the executor's own; the destructor stops.
#ifndef TETHER_CORE_TOOLKIT_SERIAL_EXECUTOR_H_
#define TETHER_CORE_TOOLKIT_SERIAL_EXECUTOR_H_

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>

#include <deque>
#include <functional>
#include <thread>

namespace tether::internal {

class SerialExecutor {
 public:
  SerialExecutor();
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues `task`; false (and `task` dropped) once stop() has begun.
  bool post(std::function<void()> task);

  // Refuses new tasks, runs the queued ones, joins the thread. Idempotent.
  void stop();

  // True on the executor's own thread.
  bool in_thread() const;

 private:
  void run();

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_SERIAL_EXECUTOR_H_
