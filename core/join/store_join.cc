#include "core/join/store_join.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

namespace tether::join {
namespace {

// A wait longer than this stands for "no deadline" (a store's timeout of 0
// means "no timeout" for some stores and "now" for others: never pass 0).
constexpr absl::Duration kLongestWait = absl::Hours(24 * 365);
// Pause between rounds whose sum was not 0, so a slow handler does not turn
// the rounds into a busy loop on the store.
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(1);
constexpr absl::Duration kLastBackoff = absl::Milliseconds(50);

// The store signals failures with exceptions; a timeout is one of them.
class StoreError : public std::exception {
 public:
  explicit StoreError(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

// Waits until `key` exists; false if `deadline` came first.
bool wait_for_key(c10d::Store& store, const std::string& key,
                  absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return store.check({key});
    const int64_t ms = std::max<int64_t>(
        1, absl::ToInt64Milliseconds(std::min(left, kLongestWait)) + 1);
    try {
      store.wait({key}, std::chrono::milliseconds(ms));
      return true;
    } catch (const std::exception& e) {
      // The store's own timeout (its socket's) can fire a little before
      // ours, or at kLongestWait: wait again for what is left.
      if (absl::Now() >= deadline ||
          absl::StrContains(e.what(), "imeout")) {
        continue;
      }
      // Failed before the deadline: not a timeout.
      throw StoreError(e.what());
    }
  }
}

class Round {
 public:
  Round(c10d::Store& store, const std::string& scope, int64_t round)
      : store_(store),
        prefix_(absl::StrCat("tether/join/", scope, "/", round, "/")) {}

  std::string key(const char* name) const {
    return absl::StrCat(prefix_, name);
  }

  // Adds 1 to counter `name`; the last of `world_size` sets `name`_all.
  void arrive(const char* name, int world_size) {
    if (store_.add(key(name), 1) == world_size) {
      store_.set(absl::StrCat(prefix_, name, "_all"), {1});
    }
  }

  bool wait_all(const char* name, absl::Time deadline) {
    return wait_for_key(store_, absl::StrCat(prefix_, name, "_all"), deadline);
  }

  int64_t count(const char* name) { return store_.add(key(name), 0); }

  void erase() {
    for (const char* name : {"arrived", "arrived_all", "active", "counted",
                             "counted_all", "left", "left_all"}) {
      store_.deleteKey(key(name));
    }
  }

 private:
  c10d::Store& store_;
  const std::string prefix_;
};

}  // namespace

StoreJoin::StoreJoin(std::shared_ptr<c10d::Store> store, std::string scope,
                     int rank, int world_size)
    : store_(std::move(store)),
      scope_(std::move(scope)),
      rank_(rank),
      world_size_(world_size) {}

StoreJoin::~StoreJoin() = default;

absl::Status StoreJoin::join(const DrainHooks& hooks, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  auto timed_out = [&](int64_t round, absl::string_view what) {
    return absl::DeadlineExceededError(
        absl::StrCat("join timed out after ", absl::FormatDuration(timeout),
                     " in round ", round, ": ", what));
  };
  absl::Duration backoff = kFirstBackoff;
  try {
    while (true) {
      const int64_t r = next_round_++;
      Round round(*store_, scope_, r);
      // Every worker has finished round r - 2 once this one has finished
      // round r - 1 (see the header): its keys can go.
      if (rank_ == 0 && r >= 2) Round(*store_, scope_, r - 2).erase();

      if (!hooks.wait_outgoing_drained(deadline)) {
        return timed_out(
            r, absl::StrCat("this worker still had requests pending; ",
                            round.count("arrived"), " of ", world_size_,
                            " workers had arrived"));
      }
      round.arrive("arrived", world_size_);
      if (!round.wait_all("arrived", deadline)) {
        return timed_out(r, absl::StrCat(round.count("arrived"), " of ",
                                         world_size_, " workers arrived"));
      }
      store_->add(round.key("active"), hooks.active_count());
      round.arrive("counted", world_size_);
      if (!round.wait_all("counted", deadline)) {
        return timed_out(
            r, absl::StrCat(round.count("counted"), " of ", world_size_,
                            " workers reported their counts"));
      }
      if (round.count("active") == 0) {
        // Rank 0's process usually hosts the store (env://, tcp://): it
        // leaves last, once every worker has read the outcome, so that none
        // finds the store gone. Late workers (past the deadline) do not
        // make the join fail: the group has drained.
        round.arrive("left", world_size_);
        if (rank_ == 0) round.wait_all("left", deadline);
        return absl::OkStatus();
      }

      const absl::Duration left = deadline - absl::Now();
      absl::SleepFor(std::min(backoff, std::max(left, absl::ZeroDuration())));
      backoff = std::min(backoff * 2, kLastBackoff);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("join: the rendezvous store failed: ", e.what()));
  }
}

}  // namespace tether::join
