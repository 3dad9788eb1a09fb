#include "core/join/store_join.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::join {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

std::shared_ptr<c10d::Store> make_store() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  return std::shared_ptr<c10d::Store>(store.get(), [store](c10d::Store*) {});
}

// An agent's traffic, set by the test.
class FakeAgent {
 public:
  void set_outgoing(int64_t n) {
    absl::MutexLock lock(&mu_);
    outgoing_ = n;
  }
  void set_incoming(int64_t n) {
    absl::MutexLock lock(&mu_);
    incoming_ = n;
  }
  // Notified once the barrier first asks this agent to drain.
  absl::Notification& asked_to_drain() { return asked_; }
  // This agent's view of which workers are lost (its pings fail).
  void set_lost(std::vector<int> ranks) {
    absl::MutexLock lock(&mu_);
    lost_ = std::move(ranks);
  }
  int probes() {
    absl::MutexLock lock(&mu_);
    return probes_;
  }

  DrainHooks hooks() {
    DrainHooks hooks;
    hooks.wait_outgoing_drained = [this](absl::Time deadline) {
      if (!asked_.HasBeenNotified()) asked_.Notify();
      absl::MutexLock lock(&mu_);
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return outgoing_ == 0;
      };
      return mu_.AwaitWithDeadline(absl::Condition(&drained), deadline);
    };
    hooks.active_count = [this] {
      absl::MutexLock lock(&mu_);
      return outgoing_ + incoming_;
    };
    hooks.check_alive = [this](const std::vector<int>& ranks) {
      absl::MutexLock lock(&mu_);
      ++probes_;
      for (int rank : ranks) {
        for (int lost : lost_) {
          if (rank == lost) {
            return absl::UnavailableError(
                absl::StrCat("worker 'w", rank, "' (rank ", rank,
                             ") is lost: connection refused"));
          }
        }
      }
      return absl::OkStatus();
    };
    return hooks;
  }

 private:
  absl::Mutex mu_;
  int64_t outgoing_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t incoming_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> lost_ ABSL_GUARDED_BY(mu_);
  int probes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification asked_;
};

// `size` workers sharing one store, each joining on its own thread.
class Group {
 public:
  explicit Group(int size, std::shared_ptr<c10d::Store> store = make_store(),
                 absl::Duration probe_interval = absl::Milliseconds(20))
      : store_(std::move(store)), agents_(size), results_(size) {
    for (int rank = 0; rank < size; ++rank) {
      joins_.push_back(std::make_unique<StoreJoin>(store_, "test", rank, size,
                                                   probe_interval));
    }
  }

  ~Group() { wait(); }

  c10d::Store& store() { return *store_; }
  FakeAgent& agent(int rank) { return agents_[rank]; }

  // Starts join() on every rank in `ranks`.
  void join(const std::vector<int>& ranks, absl::Duration timeout = kBound) {
    for (int rank : ranks) {
      threads_.emplace_back([this, rank, timeout] {
        results_[rank] = joins_[rank]->join(agents_[rank].hooks(), timeout);
        ++finished_;
      });
    }
  }

  void join_all(absl::Duration timeout = kBound) {
    std::vector<int> ranks;
    for (int rank = 0; rank < static_cast<int>(agents_.size()); ++rank) {
      ranks.push_back(rank);
    }
    join(ranks, timeout);
  }

  // Waits for every started join() to return.
  void wait() {
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

  int finished() const { return finished_.load(); }
  const absl::Status& result(int rank) const { return results_[rank]; }

  // True once some worker arrived at `round` (the barrier got that far).
  bool reached_round(int round) {
    try {
      store_->wait(
          {absl::StrCat("tether/join/test/", round, "/arrived")},
          std::chrono::milliseconds(absl::ToInt64Milliseconds(kBound)));
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

 private:
  std::shared_ptr<c10d::Store> store_;
  std::vector<FakeAgent> agents_;
  std::vector<std::unique_ptr<StoreJoin>> joins_;
  std::vector<absl::Status> results_;
  std::vector<std::thread> threads_;
  std::atomic<int> finished_{0};
};

// A worker's view of the shared store whose read of the round's sum is
// slow, and that notes when that read returned.
class SlowSumReader : public c10d::Store {
 public:
  explicit SlowSumReader(std::shared_ptr<c10d::Store> store)
      : store_(std::move(store)) {}

  absl::Time sum_read_at() {
    absl::MutexLock lock(&mu_);
    return read_at_;
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return store_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    const bool sum_read = value == 0 && absl::EndsWith(key, "/active");
    if (sum_read) absl::SleepFor(absl::Milliseconds(300));
    const int64_t result = store_->add(key, value);
    if (sum_read) {
      absl::MutexLock lock(&mu_);
      read_at_ = absl::Now();
    }
    return result;
  }
  bool deleteKey(const std::string& key) override {
    return store_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    return store_->check(keys);
  }
  int64_t getNumKeys() override { return store_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override {
    store_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  const std::shared_ptr<c10d::Store> store_;
  absl::Mutex mu_;
  absl::Time read_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

// A worker's view of the shared store that logs its requests.
class RequestLog : public c10d::Store {
 public:
  explicit RequestLog(std::shared_ptr<c10d::Store> store)
      : store_(std::move(store)) {}

  std::vector<std::string> requests() {
    absl::MutexLock lock(&mu_);
    return log_;
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    note("set ", key);
    store_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    note("compareSet ", key);
    return store_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    note("get ", key);
    return store_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    note(absl::StrCat("add ", value, " "), key);
    return store_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    note("deleteKey ", key);
    return store_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    note("check ", absl::StrJoin(keys, ","));
    return store_->check(keys);
  }
  int64_t getNumKeys() override { return store_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override {
    note("wait ", absl::StrJoin(keys, ","));
    store_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    note("wait ", absl::StrJoin(keys, ","));
    store_->wait(keys, timeout);
  }

 private:
  void note(absl::string_view what, absl::string_view key) {
    absl::MutexLock lock(&mu_);
    log_.push_back(absl::StrCat(what, key));
  }

  const std::shared_ptr<c10d::Store> store_;
  absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

// A worker waiting for another still at work (a worker idle in shutdown())
// asks the store one thing per look: its phase's counter, which also tells
// whether the join failed. Its probes need no look of their own in a group
// of two (the other is the one missing).
TEST(StoreJoin, AWaitingWorkerMakesOneStoreRequestPerLook) {
  std::shared_ptr<c10d::Store> shared = make_store();
  auto logged = std::make_shared<RequestLog>(shared);
  StoreJoin zero(logged, "test", 0, 2, absl::Milliseconds(20));
  StoreJoin one(shared, "test", 1, 2, absl::Milliseconds(20));
  FakeAgent agent0;
  FakeAgent agent1;
  absl::Status zero_result;
  std::thread thread([&] { zero_result = zero.join(agent0.hooks(), kBound); });
  absl::SleepFor(absl::Milliseconds(600));
  const std::vector<std::string> waiting = logged->requests();
  EXPECT_GT(agent0.probes(), 5);
  EXPECT_THAT(one.join(agent1.hooks(), kBound), IsOk());
  thread.join();
  EXPECT_THAT(zero_result, IsOk());
  // Arriving: its key and the counter; then looks only.
  ASSERT_GT(waiting.size(), 3u);
  EXPECT_EQ(waiting[0], "set tether/join/test/0/arrived/0");
  EXPECT_EQ(waiting[1], "add 1 tether/join/test/0/arrived");
  for (size_t i = 2; i < waiting.size(); ++i) {
    EXPECT_EQ(waiting[i], "add 0 tether/join/test/0/arrived") << "request " << i;
  }
}

// Rank 0's process usually hosts the store: it must not return (and exit)
// while another worker still reads the outcome from it.
TEST(StoreJoin, RankZeroLeavesOnlyAfterEveryWorkerReadTheOutcome) {
  std::shared_ptr<c10d::Store> shared = make_store();
  auto slow = std::make_shared<SlowSumReader>(shared);
  StoreJoin zero(shared, "test", 0, 2);
  StoreJoin one(slow, "test", 1, 2);
  FakeAgent agent0;
  FakeAgent agent1;
  absl::Time zero_left = absl::InfinitePast();
  absl::Status zero_result;
  std::thread thread([&] {
    zero_result = zero.join(agent0.hooks(), kBound);
    zero_left = absl::Now();
  });
  EXPECT_THAT(one.join(agent1.hooks(), kBound), IsOk());
  thread.join();
  EXPECT_THAT(zero_result, IsOk());
  EXPECT_GE(zero_left, slow->sum_read_at());
}

TEST(StoreJoin, IdleWorkersLeaveInTheFirstRound) {
  Group group(4);
  group.join_all();
  group.wait();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(group.result(rank), IsOk()) << "rank " << rank;
  }
  EXPECT_EQ(group.store().add("tether/join/test/0/arrived", 0), 4);
  EXPECT_FALSE(group.store().check({"tether/join/test/1/arrived"}));
}

TEST(StoreJoin, SingleWorkerJoinsAlone) {
  Group group(1);
  group.join_all();
  group.wait();
  EXPECT_THAT(group.result(0), IsOk());
}

TEST(StoreJoin, WaitsForEveryWorkersOutgoingRequests) {
  Group group(3);
  group.agent(0).set_outgoing(1);
  group.join_all();
  group.agent(0).asked_to_drain().WaitForNotificationWithTimeout(kBound);
  // Ranks 1 and 2 are held at the barrier by rank 0's pending request.
  EXPECT_EQ(group.finished(), 0);
  group.agent(0).set_outgoing(0);
  group.wait();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(group.result(rank), IsOk()) << "rank " << rank;
  }
}

TEST(StoreJoin, KeepsGoingWhileAnyWorkerHandlesARequest) {
  Group group(3);
  group.agent(2).set_incoming(1);
  group.join_all();
  // The sum stays 1, so the group goes round after round.
  ASSERT_TRUE(group.reached_round(2));
  EXPECT_EQ(group.finished(), 0);
  group.agent(2).set_incoming(0);
  group.wait();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(group.result(rank), IsOk()) << "rank " << rank;
  }
  // Finished rounds are cleaned up behind the group.
  EXPECT_FALSE(group.store().check({"tether/join/test/0/arrived"}));
}

TEST(StoreJoin, TimesOutNamingHowManyWorkersArrived) {
  Group group(3);
  group.join({0, 1}, absl::Milliseconds(200));
  group.wait();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(group.result(rank),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         HasSubstr("2 of 3 workers arrived")));
  }
}

TEST(StoreJoin, TimesOutWhenOutgoingRequestsNeverFinish) {
  Group group(2);
  group.agent(1).set_outgoing(3);
  group.join_all(absl::Milliseconds(200));
  group.wait();
  EXPECT_THAT(group.result(1), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                        HasSubstr("requests pending")));
  EXPECT_THAT(group.result(0), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                        HasSubstr("1 of 2 workers arrived")));
}

TEST(StoreJoin, RepeatedJoinsStayInStep) {
  Group group(3);
  for (int i = 0; i < 3; ++i) {
    group.join_all();
    group.wait();
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_THAT(group.result(rank), IsOk())
          << "join " << i << " rank " << rank;
    }
  }
  EXPECT_TRUE(group.store().check({"tether/join/test/2/arrived"}));
}

TEST(StoreJoin, ScopesDoNotMix) {
  std::shared_ptr<c10d::Store> store = make_store();
  StoreJoin a(store, "a", 0, 1);
  StoreJoin b(store, "b", 0, 2);  // would wait for a second worker
  FakeAgent agent;
  EXPECT_THAT(a.join(agent.hooks(), kBound), IsOk());
  EXPECT_THAT(b.join(agent.hooks(), absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

// Waiting for a worker that is alive and still working is correct, however
// long its work lasts: no overall bound unless the user sets one.
TEST(StoreJoin, WaitsForALiveWorkerWithoutABound) {
  Group group(3);
  group.join({0, 1}, absl::InfiniteDuration());
  // Many probe intervals (20 ms) pass while rank 2 is still at work.
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(group.finished(), 0);
  EXPECT_GT(group.agent(0).probes(), 5);
  group.join({2}, absl::InfiniteDuration());
  group.wait();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(group.result(rank), IsOk()) << "rank " << rank;
  }
}

// A lost worker ends every waiting worker's join at once, naming it, not
// after an overall timeout (there is none here).
TEST(StoreJoin, ALostWorkerEndsTheJoinNamingIt) {
  Group group(3);
  group.agent(0).set_lost({2});
  group.agent(1).set_lost({2});
  const absl::Time start = absl::Now();
  group.join({0, 1}, absl::InfiniteDuration());
  group.wait();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(group.result(rank),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("worker 'w2' (rank 2) is lost")))
        << "rank " << rank;
  }
}

// One worker finds the lost one; the others learn it from the store.
TEST(StoreJoin, OneWorkersFindingEndsEveryonesJoin) {
  Group group(4);
  group.agent(3).set_lost({2});  // only rank 3 can tell
  group.join({0, 1, 3}, absl::InfiniteDuration());
  group.wait();
  for (int rank : {0, 1, 3}) {
    EXPECT_THAT(group.result(rank),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("worker 'w2' (rank 2) is lost")))
        << "rank " << rank;
  }
}

// Rank 0 (a parameter server waiting in shutdown) finds rank 2 lost while
// rank 1 is still at work: it leaves at once instead of waiting for rank 1
// to read why (it may never join), and rank 1, when it joins, reads why.
TEST(StoreJoin, RankZeroDoesNotWaitForAWorkerStillAtWork) {
  Group group(3);
  group.agent(0).set_lost({2});
  const absl::Time start = absl::Now();
  group.join({0}, absl::InfiniteDuration());
  group.wait();
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(group.result(0),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker 'w2' (rank 2) is lost")));
  // The probes come every 20 ms; rank 0 waited 5 s for rank 1 before.
  EXPECT_LT(took, absl::Seconds(3)) << "rank 0 waited for a worker at work";
  group.join({1}, absl::InfiniteDuration());
  group.wait();
  EXPECT_THAT(group.result(1),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker 'w2' (rank 2) is lost")));
}

// A store that fails, as one served by a lost rank 0 does.
class DeadStore : public c10d::Store {
 public:
  [[noreturn]] static void fail() {
    throw std::runtime_error("the rendezvous store is lost: connection reset");
  }
  void set(const std::string&, const std::vector<uint8_t>&) override { fail(); }
  std::vector<uint8_t> get(const std::string&) override { fail(); }
  int64_t add(const std::string&, int64_t) override { fail(); }
  bool deleteKey(const std::string&) override { fail(); }
  bool check(const std::vector<std::string>&) override { fail(); }
  int64_t getNumKeys() override { fail(); }
  void wait(const std::vector<std::string>&) override { fail(); }
  void wait(const std::vector<std::string>&,
            const std::chrono::milliseconds&) override {
    fail();
  }
};

TEST(StoreJoin, AFailedStoreNamesALostRankZero) {
  auto dead = c10::make_intrusive<DeadStore>();
  std::shared_ptr<c10d::Store> store(dead.get(), [dead](c10d::Store*) {});
  StoreJoin one(store, "test", 1, 2);
  FakeAgent agent;
  agent.set_lost({0});
  EXPECT_THAT(one.join(agent.hooks(), absl::InfiniteDuration()),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("rank 0, whose process serves the "
                                       "rendezvous store, is lost"),
                             HasSubstr("connection reset"))));
  agent.set_lost({});
  EXPECT_THAT(one.join(agent.hooks(), absl::InfiniteDuration()),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("the rendezvous store failed")));
}

}  // namespace
}  // namespace tether::join
