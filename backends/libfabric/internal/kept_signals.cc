#include "backends/libfabric/internal/kept_signals.h"

#include <absl/base/thread_annotations.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <glog/logging.h>

#include <string>

namespace tether::backends::libfabric::internal {
namespace {

constexpr int kLastSignal = 64;

// Held by the outermost scope of any thread, from save to restore.
absl::Mutex& scope_mutex() {
  static absl::Mutex* mutex = new absl::Mutex();
  return *mutex;
}

thread_local int depth = 0;
thread_local int restored_count = 0;

// Handler, flags and mask. The mask is compared signal by signal: glibc
// fills only the kernel's 8 bytes of the 128 of a sigset_t it returns and
// leaves the rest as its stack held them.
bool same(const struct sigaction& a, const struct sigaction& b) {
  if (a.sa_handler != b.sa_handler || a.sa_flags != b.sa_flags) return false;
  for (int signal = 1; signal <= kLastSignal; ++signal) {
    if (sigismember(&a.sa_mask, signal) != sigismember(&b.sa_mask, signal)) {
      return false;
    }
  }
  return true;
}

}  // namespace

KeptSignals::KeptSignals(const char* why) : why_(why), outermost_(depth == 0) {
  ++depth;
  if (!outermost_) return;
  scope_mutex().Lock();
  saved_.reserve(kLastSignal);
  for (int signal = 1; signal <= kLastSignal; ++signal) {
    Saved entry{signal, {}};
    if (::sigaction(signal, nullptr, &entry.action) == 0) {
      saved_.push_back(entry);
    }
  }
}

KeptSignals::~KeptSignals() {
  --depth;
  if (!outermost_) return;
  std::vector<std::string> restored;
  for (const Saved& entry : saved_) {
    struct sigaction now {};
    if (::sigaction(entry.signal, nullptr, &now) != 0 ||
        same(now, entry.action)) {
      continue;
    }
    // SIGKILL and SIGSTOP cannot change, so they never differ.
    if (::sigaction(entry.signal, &entry.action, nullptr) == 0) {
      const char* name = sigabbrev_np(entry.signal);
      restored.push_back(name != nullptr ? std::string("SIG") + name
                                         : std::to_string(entry.signal));
    }
  }
  scope_mutex().Unlock();
  restored_count = static_cast<int>(restored.size());
  if (!restored.empty()) {
    VLOG(1) << why_ << " installed signal handlers; put back the dispositions "
            << "of " << absl::StrJoin(restored, ", ");
  }
}

int KeptSignals::last_restored_count() { return restored_count; }

}  // namespace tether::backends::libfabric::internal
