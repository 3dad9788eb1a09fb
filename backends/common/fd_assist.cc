#include "backends/common/fd_assist.h"

#include <absl/time/clock.h>
#include <absl/time/time.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <thread>
#include <utility>

#include "core/future.h"
#include "core/toolkit/poll_policy.h"

namespace tether::backends::common {
namespace {

std::atomic<int> g_assist_descriptors{0};

// One per thread that sends.
class Assistant final : public tether::internal::WaitAssist {
 public:
  ~Assistant() override {
    if (tether::internal::wait_assist == this) {
      tether::internal::wait_assist = nullptr;
    }
    if (const int fd = event_fd_.load(); fd >= 0) {
      ::close(fd);
      g_assist_descriptors.fetch_sub(1);
    }
  }

  void arm(std::weak_ptr<AssistSource> source) {
    source_ = std::move(source);
    tether::internal::wait_assist = this;
  }

  void wait(const std::atomic<bool>& done, absl::Time deadline) override {
    std::shared_ptr<AssistSource> source = std::exchange(source_, {}).lock();
    if (source == nullptr) return;
    int event_fd = event_fd_.load();
    if (event_fd < 0) {
      event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (event_fd < 0) return;
      g_assist_descriptors.fetch_add(1);
      event_fd_.store(event_fd);
      // A wake() that found no eventfd yet (it sets signalled_ first).
      if (signalled_.load()) return;
    }
    const int fd = source->begin_assist();
    if (fd < 0) return;
    // Polls the descriptor first if waits may (core/future.h:
    // wait_poll_policy): a thread that is running needs no wake-up when the
    // answer comes.
    if (PollWindow window(tether::internal::wait_poll_policy());
        window.enabled()) {
      window.worked();
      while (!done.load(std::memory_order_acquire) && absl::Now() < deadline) {
        pollfd input = {fd, POLLIN, 0};
        const int n = ::poll(&input, 1, 0);
        if (n < 0 && errno != EINTR) break;
        if (n > 0) {
          if (!source->assist_step()) break;
          window.worked();
        } else if (!window.keep_polling()) {
          break;
        }
      }
    }
    while (!done.load(std::memory_order_acquire)) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      // Bounded, so that a descriptor the backend closed meanwhile (its
      // number perhaps reused) is noticed by assist_step().
      const int timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
          1, 1000));
      pollfd fds[2] = {{fd, POLLIN, 0}, {event_fd, POLLIN, 0}};
      const int n = ::poll(fds, 2, timeout_ms);
      if (n < 0 && errno != EINTR) break;
      if (n > 0 && fds[1].revents != 0) break;  // woken: the future is done
      if (!source->assist_step()) break;
    }
    source->end_assist();
  }

  void wake() override {
    if (std::this_thread::get_id() == owner_) return;
    signalled_.store(true);
    if (const int fd = event_fd_.load(); fd >= 0) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
    }
  }

  // Every wake() of this wait came before (under the future's lock, which
  // the waiter took since): the eventfd is read only if one came.
  void settle() override {
    if (!signalled_.exchange(false)) return;
    uint64_t count = 0;
    const int fd = event_fd_.load();
    while (fd >= 0 && ::read(fd, &count, sizeof(count)) > 0) {
    }
  }

 private:
  std::atomic<int> event_fd_{-1};
  const std::thread::id owner_ = std::this_thread::get_id();
  // Sequentially consistent with event_fd_: a wake() either finds the
  // eventfd or is seen by the wait that made it.
  std::atomic<bool> signalled_{false};
  std::weak_ptr<AssistSource> source_;
};

}  // namespace

int assist_descriptors() { return g_assist_descriptors.load(); }

void arm_fd_assist(std::weak_ptr<AssistSource> source) {
  thread_local Assistant assistant;
  assistant.arm(std::move(source));
}

}  // namespace tether::backends::common
