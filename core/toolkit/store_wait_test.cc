#include "core/toolkit/store_wait.h"

#include <absl/time/clock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

namespace tether::internal {
namespace {

// Forwards every request to LibTorch's TCPStore (its server on loopback)
// and counts them: the waiter's round trips.
class CountingStore final : public c10d::Store {
 public:
  explicit CountingStore(c10::intrusive_ptr<c10d::Store> inner)
      : inner_(std::move(inner)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    ++requests;
    inner_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    ++requests;
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    ++requests;
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    ++requests;
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    ++requests;
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    ++requests;
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    ++requests;
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    ++requests;
    inner_->wait(keys, timeout);
  }
  std::atomic<int> requests{0};

 private:
  c10::intrusive_ptr<c10d::Store> inner_;
};

class StoreWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = std::chrono::seconds(30);
    server_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  }
  c10::intrusive_ptr<c10d::TCPStore> client() const {
    c10d::TCPStoreOptions options;
    options.port = server_->getPort();
    options.isServer = false;
    options.timeout = std::chrono::seconds(30);
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  }
  c10::intrusive_ptr<c10d::TCPStore> server_;
};

// The keys arrive one by one, 100 ms apart, while the waiter waits: it is
// woken by each arrival, one request per key. Polling at up to 50 ms sent a
// request per interval (here at least 6 for the 300 ms).
TEST_F(StoreWaitTest, WokenByEachArrivalWithOneRequestPerKey) {
  CountingStore waiter(client());
  c10::intrusive_ptr<c10d::TCPStore> setter = client();
  const std::vector<std::string> keys = {"k/0", "k/1", "k/2"};
  std::thread late([&] {
    for (const std::string& key : keys) {
      absl::SleepFor(absl::Milliseconds(100));
      setter->set(key, {1});
    }
  });
  const bool all = wait_for_keys(waiter, keys, absl::Now() + absl::Seconds(30));
  late.join();
  EXPECT_TRUE(all);
  EXPECT_EQ(waiter.requests.load(), 3);
  EXPECT_TRUE(server_->check(keys));
}

TEST_F(StoreWaitTest, KeysAlreadySetTakeOneRequestEach) {
  CountingStore waiter(client());
  server_->set("a", {1});
  server_->set("b", {2});
  EXPECT_TRUE(wait_for_keys(waiter, {"a", "b"}, absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(waiter.requests.load(), 2);
}

// A key that never comes: false at the deadline, not an exception, and the
// store still answers (a key set meanwhile is seen).
TEST_F(StoreWaitTest, FalseAtTheDeadline) {
  c10::intrusive_ptr<c10d::TCPStore> waiter = client();
  server_->set("here", {1});
  const absl::Time start = absl::Now();
  EXPECT_FALSE(wait_for_keys(*waiter, {"here", "never"},
                             start + absl::Milliseconds(200)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_TRUE(server_->check({"here"}));
  EXPECT_FALSE(server_->check({"never"}));
}

TEST_F(StoreWaitTest, PassedDeadlineSendsNothing) {
  CountingStore waiter(client());
  EXPECT_FALSE(wait_for_keys(waiter, {"never"}, absl::Now()));
  EXPECT_EQ(waiter.requests.load(), 0);
}

}  // namespace
}  // namespace tether::internal
