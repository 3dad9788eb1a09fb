#include "core/toolkit/poll_policy.h"

#include "core/toolkit/usable_cores.h"

#include <absl/strings/numbers.h>
#include <absl/strings/string_view.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>

namespace tether {
namespace internal {

std::optional<int> runnable_threads(std::string_view loadavg) {
  // Three load averages, then "runnable/total".
  size_t at = 0;
  for (int field = 0; field < 3; ++field) {
    at = loadavg.find(' ', at);
    if (at == std::string_view::npos) return std::nullopt;
    ++at;
  }
  const size_t slash = loadavg.find('/', at);
  if (slash == std::string_view::npos) return std::nullopt;
  int runnable = 0;
  if (!absl::SimpleAtoi(
          absl::string_view(loadavg.data() + at, slash - at), &runnable) ||
      runnable < 0) {
    return std::nullopt;
  }
  return runnable;
}

}  // namespace internal

namespace {

constexpr int64_t kRecheckNs = 1000000;  // a millisecond

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Kept open: a pread at offset 0 makes the kernel write the line afresh.
int loadavg_fd() {
  static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  return fd;
}

std::atomic<int64_t> g_checked_ns{INT64_MIN / 2};
std::atomic<bool> g_spare{false};

bool read_spare() {
  static const int cores = usable_cores();
  const int fd = loadavg_fd();
  if (fd < 0) return false;
  char text[128];
  const ssize_t n = ::pread(fd, text, sizeof(text), 0);
  if (n <= 0) return false;
  const std::optional<int> runnable =
      internal::runnable_threads(std::string_view(text, n));
  // One more than the cores: a poller yields its core at every turn, so
  // one thread ready beside the pollers (the pool thread running the call
  // they wait for) still runs at once.
  return runnable.has_value() && *runnable <= cores + 1;
}

}  // namespace

bool cores_are_spare() {
  const int64_t now = now_ns();
  int64_t checked = g_checked_ns.load(std::memory_order_relaxed);
  // One thread of the process reads; the others take its answer meanwhile.
  if (now - checked < kRecheckNs ||
      !g_checked_ns.compare_exchange_strong(checked, now,
                                            std::memory_order_relaxed)) {
    return g_spare.load(std::memory_order_relaxed);
  }
  const bool spare = read_spare();
  g_spare.store(spare, std::memory_order_relaxed);
  return spare;
}

bool PollWindow::keep_polling() {
  if (length_.count() <= 0) return false;
  if (std::chrono::steady_clock::now() >= until_) return false;
  if (only_on_spare_cores_ && !cores_are_spare()) return false;
  std::this_thread::yield();
  return true;
}

}  // namespace tether
