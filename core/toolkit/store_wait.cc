#include "core/toolkit/store_wait.h"

#include <absl/time/clock.h>

#include <algorithm>
#include <chrono>
#include <exception>

namespace tether::internal {
namespace {

constexpr absl::Duration kClockSlack = absl::Milliseconds(100);

}  // namespace

bool wait_for_keys(c10d::Store& store, const std::vector<std::string>& keys,
                   absl::Time deadline) {
  for (const std::string& key : keys) {
    // A key already set answers at once: one request either way.
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    // A zero timeout means "no timeout" to c10d's stores: at least 1 ms.
    const auto timeout = std::chrono::milliseconds(std::max<int64_t>(
        1, absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)))));
    try {
      store.wait({key}, timeout);
    } catch (const std::exception&) {
      // A store's timeout (its wording differs between stores) or a lost
      // store: the deadline tells them apart (within the slack of the
      // store's own clock).
      if (absl::Now() + kClockSlack < deadline) throw;
      return false;
    }
  }
  return true;
}

}  // namespace tether::internal
