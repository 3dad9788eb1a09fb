#include "core/join/store_join.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/string_view.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

namespace tether::join {
namespace {

// Pause between rounds whose sum was not 0, so a slow handler does not turn
// the rounds into a busy loop on the store.
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(1);
constexpr absl::Duration kLastBackoff = absl::Milliseconds(50);
// How long rank 0 stays after a failed join for the others to read why.
constexpr absl::Duration kFailedGrace = absl::Seconds(5);
// A worker that waits long in a join (for another still at work) asks the
// store less often: at most a tenth of the time it has waited between two
// looks, up to this. Leaving then comes at most a tenth of the wait late,
// and an idle worker waiting in shutdown() costs the store's host and
// itself two requests a second, not 25. Liveness is probed as before.
constexpr absl::Duration kLongWaitBackoff = absl::Milliseconds(500);

absl::Duration backoff_cap(absl::Duration waited) {
  return std::clamp(waited / 10, kLastBackoff, kLongWaitBackoff);
}

// What a worker that finds the join failed adds to the counters of its
// round's phases, after publishing why: every waiter's next look at its
// counter sees it, so that one request a wake tells both whether all have
// arrived and whether the join failed.
constexpr int64_t kFailedMark = int64_t{1} << 40;

// The phases of a round, in order, named as in the keys and messages.
enum Phase { kArrived, kCounted, kLeft, kPhases };
constexpr const char* kPhaseNames[kPhases] = {"arrived", "counted", "left"};

// A round's keys: a counter per phase, and one key per worker that has
// arrived at each phase (so that a waiter knows whom to ask). Built once per
// round, as they are asked for: a waiter looks at them for as long as it
// waits.
class Round {
 public:
  Round(c10d::Store& store, const std::string& scope, int64_t round,
        int world_size)
      : store_(store),
        prefix_(absl::StrCat("tether/join/", scope, "/", round, "/")),
        world_size_(world_size),
        active_key_(absl::StrCat(prefix_, "active")) {
    for (int phase = 0; phase < kPhases; ++phase) {
      counters_[phase] = absl::StrCat(prefix_, kPhaseNames[phase]);
    }
  }

  const std::string& active_key() const { return active_key_; }

  // Marks `rank` arrived at `phase`.
  void arrive(Phase phase, int rank) {
    store_.set(rank_key(phase, rank), {1});
    store_.add(counters_[phase], 1);
  }

  // How many workers have arrived at `phase` (kFailedMark or more once a
  // worker found the join failed): one request.
  int64_t count(Phase phase) { return store_.add(counters_[phase], 0); }

  // Ends every wait on this round's phases (see kFailedMark).
  void mark_failed() {
    for (const std::string& counter : counters_) {
      store_.add(counter, kFailedMark);
    }
  }

  // The ranks not marked arrived at `phase`, among `candidates` (the other
  // workers). `arrived`: the phase's count from a look just before, or -1.
  // When that count leaves as many missing as there are candidates (only
  // this worker has arrived, as always in a group of two), they are all
  // missing, without a look each.
  std::vector<int> missing(Phase phase, const std::vector<int>& candidates,
                           int64_t arrived = -1) {
    if (arrived < 0) arrived = count(phase);
    if (world_size_ - arrived >= static_cast<int64_t>(candidates.size())) {
      return candidates;
    }
    std::vector<int> out;
    for (int rank : candidates) {
      if (!store_.check({rank_key(phase, rank)})) out.push_back(rank);
    }
    return out;
  }

  void erase() {
    for (int phase = 0; phase < kPhases; ++phase) {
      store_.deleteKey(counters_[phase]);
      for (int rank = 0; rank < world_size_; ++rank) {
        store_.deleteKey(rank_key(static_cast<Phase>(phase), rank));
      }
    }
    store_.deleteKey(active_key_);
  }

 private:
  // "<counter>/<rank>".
  const std::string& rank_key(Phase phase, int rank) {
    std::vector<std::string>& keys = rank_keys_[phase];
    if (keys.empty()) {
      keys.reserve(world_size_);
      for (int r = 0; r < world_size_; ++r) {
        keys.push_back(absl::StrCat(counters_[phase], "/", r));
      }
    }
    return keys[rank];
  }

  c10d::Store& store_;
  const std::string prefix_;
  const int world_size_;
  const std::string active_key_;
  std::string counters_[kPhases];
  std::vector<std::string> rank_keys_[kPhases];
};

std::string ranks_text(const std::vector<int>& ranks) {
  return absl::StrJoin(ranks, ", ");
}

}  // namespace

StoreJoin::StoreJoin(std::shared_ptr<c10d::Store> store, std::string scope,
                     int rank, int world_size, absl::Duration probe_interval)
    : store_(std::move(store)),
      scope_(std::move(scope)),
      rank_(rank),
      world_size_(world_size),
      probe_interval_(probe_interval) {}

StoreJoin::~StoreJoin() = default;

absl::Status StoreJoin::join(const DrainHooks& hooks, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + timeout;
  const std::string failed_key = absl::StrCat("tether/join/", scope_, "/failed");
  auto timed_out = [&](int64_t round, absl::string_view what) {
    return absl::DeadlineExceededError(
        absl::StrCat("join timed out after ", absl::FormatDuration(timeout),
                     " in round ", round, ": ", what));
  };
  std::vector<int> others;
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_) others.push_back(r);
  }
  auto seen_key = [&](int rank) {
    return absl::StrCat("tether/join/", scope_, "/failed_seen/", rank);
  };
  // A worker leaving a failed join says it has read why. Rank 0, whose
  // process usually serves the store, then waits (at most kFailedGrace)
  // until every other worker in the join (arrived in `round`) has read it
  // too or is itself lost, so that none finds the store gone instead of the
  // reason. A worker not in the join yet is still at work, maybe for long:
  // rank 0 does not wait for it, and its own join, if it comes, names rank
  // 0 lost. (Waiting for it kept a parameter server that found a trainer
  // lost, and with it the other trainers, 5 s longer.)
  auto leave_failed = [&](Round& round, absl::Status why) {
    store_->set(seen_key(rank_), {1});
    if (rank_ != 0) return why;
    const absl::Time until = absl::Now() + kFailedGrace;
    std::vector<int> waiting;
    const std::vector<int> absent = round.missing(kArrived, others);
    for (int r : others) {
      if (!std::binary_search(absent.begin(), absent.end(), r)) {
        waiting.push_back(r);
      }
    }
    absl::Time next_probe = absl::Now() + kLastBackoff * 4;
    while (!waiting.empty() && absl::Now() < until) {
      std::vector<int> still;
      const bool probe = hooks.check_alive && absl::Now() >= next_probe;
      for (int r : waiting) {
        if (store_->check({seen_key(r)})) continue;
        if (probe && !hooks.check_alive({r}).ok()) continue;
        still.push_back(r);
      }
      if (probe) next_probe = absl::Now() + kLastBackoff * 4;
      waiting.swap(still);
      if (!waiting.empty()) absl::SleepFor(kLastBackoff / 5);
    }
    return why;
  };
  // Publishes why this worker's join fails, for the others (the first
  // reason stays), ends their waits (kFailedMark), and returns it.
  auto fail_group = [&](Round& round, const absl::Status& why) {
    store_->compareSet(failed_key, {},
                       std::vector<uint8_t>(why.message().begin(),
                                            why.message().end()));
    round.mark_failed();
    return leave_failed(round, why);
  };
  // Waits until every worker has arrived at `phase` of `round`, checking
  // meanwhile that the group has not failed and that the workers still
  // missing are alive. Each wake costs one request (the phase's counter)
  // and, every probe interval, the PINGs (and the missing ones' keys in a
  // group of more than two where some have arrived).
  auto wait_all = [&](Round& round, int64_t r, Phase phase) -> absl::Status {
    absl::Duration pause = kFirstBackoff;
    const absl::Time started = absl::Now();
    absl::Time next_probe = started + probe_interval_;
    while (true) {
      const int64_t arrived = round.count(phase);
      if (arrived >= kFailedMark) {
        std::vector<uint8_t> why = store_->get(failed_key);
        return leave_failed(round, absl::UnavailableError(
            absl::StrCat("join failed: ", std::string(why.begin(), why.end()))));
      }
      if (arrived >= world_size_) return absl::OkStatus();
      const absl::Time now = absl::Now();
      if (hooks.check_alive && now >= next_probe) {
        std::vector<int> missing = round.missing(phase, others, arrived);
        if (!missing.empty()) {
          if (absl::Status alive = hooks.check_alive(missing); !alive.ok()) {
            return fail_group(round, absl::Status(
                alive.code(), absl::StrCat("worker ", rank_, " found: ",
                                           alive.message())));
          }
        }
        next_probe = absl::Now() + probe_interval_;
      }
      if (now >= deadline) {
        return timed_out(
            r, absl::StrCat(arrived, " of ", world_size_, " workers ",
                            kPhaseNames[phase], "; missing rank(s) ",
                            ranks_text(round.missing(phase, others, arrived))));
      }
      absl::SleepFor(std::min(pause, deadline - now));
      pause = std::min(pause * 2, backoff_cap(now - started));
    }
  };

  absl::Duration backoff = kFirstBackoff;
  bool all_arrived_called = false;
  int64_t r = next_round_;
  try {
    while (true) {
      r = next_round_++;
      Round round(*store_, scope_, r, world_size_);
      // Every worker has finished round r - 2 once this one has finished
      // round r - 1 (see the header): its keys can go.
      if (rank_ == 0 && r >= 2) Round(*store_, scope_, r - 2, world_size_).erase();

      if (!hooks.wait_outgoing_drained(deadline)) {
        return timed_out(
            r, absl::StrCat("this worker still had requests pending; ",
                            round.count(kArrived) % kFailedMark, " of ",
                            world_size_, " workers had arrived"));
      }
      round.arrive(kArrived, rank_);
      if (absl::Status all = wait_all(round, r, kArrived); !all.ok()) {
        return all;
      }
      if (hooks.all_arrived && !all_arrived_called) {
        all_arrived_called = true;
        hooks.all_arrived();
      }
      store_->add(round.active_key(), hooks.active_count());
      round.arrive(kCounted, rank_);
      if (absl::Status all = wait_all(round, r, kCounted); !all.ok()) {
        return all;
      }
      if (store_->add(round.active_key(), 0) == 0) {
        // Rank 0's process usually hosts the store (env://, tcp://): it
        // leaves last, once every worker has read the outcome, so that none
        // finds the store gone. A worker lost now does not make the join
        // fail: the group has drained.
        round.arrive(kLeft, rank_);
        if (rank_ == 0) (void)wait_all(round, r, kLeft);
        return absl::OkStatus();
      }

      const absl::Duration left = deadline - absl::Now();
      absl::SleepFor(std::min(backoff, std::max(left, absl::ZeroDuration())));
      backoff = std::min(backoff * 2, kLastBackoff);
    }
  } catch (const std::exception& e) {
    // The store failed. Rank 0 serves it for env:// and tcp://: if rank 0
    // is lost, say so.
    if (rank_ != 0 && hooks.check_alive) {
      absl::Status alive = hooks.check_alive({0});
      if (!alive.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "join: rank 0, whose process serves the rendezvous store, is "
            "lost: ",
            alive.message(), " (the store: ", e.what(), ")"));
      }
    }
    return absl::UnavailableError(absl::StrCat(
        "join: the rendezvous store failed in round ", r, ": ", e.what()));
  }
}

}  // namespace tether::join
