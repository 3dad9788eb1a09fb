// PollPolicy: how long a thread that waits for work polls before it sleeps,
// and whether it polls only while no thread of the machine waits for a core.
//
// A sleeping thread costs a wake-up when its work comes: tens of
// microseconds, and on an idle virtual machine (its virtual core halted)
// about a hundred, the largest share of a small call there
// (docs/benchmarks.md). A thread that polls instead takes the work at once,
// at the price of its core. That price is nothing while some core would
// otherwise be idle, and real when threads wait for one: there a poll takes
// a core from the thread that would produce the work, and wake-ups are cheap
// anyway (the cores are awake). So the default polls only while no thread
// waits for a core (`cores_are_spare()`), and `RpcOptions::busy_poll` polls
// whatever the load, for whoever wants to spend a core.
//
// Every waiting loop of tether uses the same policy: the backends' threads
// that wait for messages (after their last one) and a thread that waits for a
// future (core/future.h) or for the bytes of its answer (backends/common/
// fd_assist).
#ifndef TETHER_CORE_TOOLKIT_POLL_POLICY_H_
#define TETHER_CORE_TOOLKIT_POLL_POLICY_H_

#include <absl/time/time.h>

#include <chrono>
#include <optional>
#include <string_view>

namespace tether {

struct PollPolicy {
  // How long a waiting thread polls (after its last work, or from the start
  // of a wait for a result) before it sleeps. Zero: it sleeps at once.
  absl::Duration window = absl::ZeroDuration();
  // Polls only while cores_are_spare(); false: whatever the load.
  bool only_on_spare_cores = true;
};

// True when no thread of the machine waits long for a core: the threads
// ready to run (the kernel's count in /proc/loadavg, the pollers among them)
// are at most one more than the cores this process may use
// (core/toolkit/usable_cores.h: online, allowed by its CPU affinity, within
// its control group's CPU quota); pollers yield at every turn, so one more
// thread runs at once. Read at most once a millisecond per process, so a
// polling loop may ask on every turn; false when it cannot be read.
bool cores_are_spare();

namespace internal {

// The number of threads ready to run in the text of /proc/loadavg ("0.52
// 0.58 0.59 3/457 12345" -> 3), or nothing when it is not of that form.
std::optional<int> runnable_threads(std::string_view loadavg);

}  // namespace internal

// The turns of one polling loop: started() (or worked()) opens a window of
// the policy's length; keep_polling() says whether to poll once more, and
// yields the core first so that a thread waiting for it runs.
class PollWindow {
 public:
  explicit PollWindow(const PollPolicy& policy)
      : length_(absl::ToChronoNanoseconds(policy.window)),
        only_on_spare_cores_(policy.only_on_spare_cores) {}

  bool enabled() const { return length_.count() > 0; }
  // Work was found (or a wait starts): polling goes on for the window.
  void worked() { until_ = std::chrono::steady_clock::now() + length_; }
  // True while the window is open and the policy allows a poll; yields.
  bool keep_polling();

 private:
  std::chrono::nanoseconds length_;
  bool only_on_spare_cores_;
  std::chrono::steady_clock::time_point until_{};
};

}  // namespace tether

#endif  // TETHER_CORE_TOOLKIT_POLL_POLICY_H_
