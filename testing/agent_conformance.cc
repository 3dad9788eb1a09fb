#include "testing/agent_conformance.h"

#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/rendezvous.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(30);

c10::Storage make_storage(size_t nbytes, uint8_t seed) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::GetCPUAllocator(), /*resizable=*/false);
  auto* data = static_cast<uint8_t*>(storage.data());
  for (size_t i = 0; i < nbytes; ++i) data[i] = static_cast<uint8_t>(seed + i * 31);
  return storage;
}

bool storage_matches(const c10::Storage& storage, size_t nbytes,
                     uint8_t seed) {
  if (storage.nbytes() != nbytes) return false;
  const auto* data = static_cast<const uint8_t*>(storage.data());
  for (size_t i = 0; i < nbytes; ++i) {
    if (data[i] != static_cast<uint8_t>(seed + i * 31)) return false;
  }
  return true;
}

// An echo: PING -> PONG with the same payload (suffixed) and storages.
Future<Message> echo(Message request) {
  Message response;
  response.type = MessageType::kPong;
  response.payload = request.payload + "/pong";
  response.storages = std::move(request.storages);
  return Future<Message>::ready(std::move(response));
}

Message ping(std::string payload) {
  Message message;
  message.type = MessageType::kPing;
  message.payload = std::move(payload);
  return message;
}

// `size` agents of the backend under test, meeting in one process.
class Group {
 public:
  Group(const Backend& backend, int size) {
    static std::atomic<int> counter{0};
    const std::string init_method =
        absl::StrCat("memory://conformance_", counter++, "_", getpid());
    agents_.resize(size);
    std::vector<absl::Status> errors(size);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < size; ++rank) {
      threads.emplace_back([&, rank] {
        absl::StatusOr<RendezvousResult> group =
            rendezvous(init_method, absl::StrCat("agent", rank), rank, size,
                       kBound);
        if (!group.ok()) {
          errors[rank] = group.status();
          return;
        }
        AgentSetup setup;
        setup.self = group->self;
        setup.workers = group->workers;
        setup.store = group->store;
        setup.group_key = group->group_key;
        absl::StatusOr<std::unique_ptr<Agent>> agent =
            backend.create(std::move(setup));
        if (!agent.ok()) {
          errors[rank] = agent.status();
          return;
        }
        agents_[rank] = std::move(*agent);
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (const absl::Status& error : errors) {
      EXPECT_THAT(error, IsOk());
    }
  }

  ~Group() {
    for (auto& agent : agents_) {
      if (agent) agent->shutdown();
    }
  }

  bool ok() const {
    for (const auto& agent : agents_) {
      if (!agent) return false;
    }
    return true;
  }

  Agent& operator[](int rank) { return *agents_[rank]; }

  void start_all(const RequestHandler& handler) {
    for (auto& agent : agents_) ASSERT_THAT(agent->start(handler), IsOk());
  }

 private:
  std::vector<std::unique_ptr<Agent>> agents_;
};

TEST_P(AgentConformance, RequestAndResponseCarryPayloadAndStorages) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  Message request = ping("hello");
  request.storages.push_back(make_storage(100, 1));
  request.storages.push_back(make_storage(0, 2));
  request.storages.push_back(make_storage(4096, 3));
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), std::move(request), kBound).get();
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->type, MessageType::kPong);
  EXPECT_EQ(response->payload, "hello/pong");
  ASSERT_EQ(response->storages.size(), 3u);
  EXPECT_TRUE(storage_matches(response->storages[0], 100, 1));
  EXPECT_TRUE(storage_matches(response->storages[1], 0, 2));
  EXPECT_TRUE(storage_matches(response->storages[2], 4096, 3));
}

TEST_P(AgentConformance, SendToSelf) {
  Group group(GetParam().backend(), 1);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  absl::StatusOr<Message> response =
      group[0].send(group[0].self(), ping("me"), kBound).get();
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->payload, "me/pong");
}

TEST_P(AgentConformance, WorkerInfosInRankOrder) {
  Group group(GetParam().backend(), 3);
  ASSERT_TRUE(group.ok());
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(group[rank].self().id, rank);
    ASSERT_EQ(group[rank].worker_infos().size(), 3u);
    EXPECT_EQ(group[rank].worker_infos()[2].name, "agent2");
  }
}

TEST_P(AgentConformance, ManyRequestsInFlightBothWays) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  constexpr int kCalls = 1000;
  std::vector<Future<Message>> futures;
  for (int i = 0; i < kCalls; ++i) {
    int from = i % 2;
    Message request = ping(absl::StrCat("call", i));
    request.storages.push_back(make_storage(64, static_cast<uint8_t>(i)));
    futures.push_back(
        group[from].send(group[1 - from].self(), std::move(request), kBound));
  }
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<Message> response = futures[i].get();
    ASSERT_THAT(response, IsOk()) << "call " << i;
    EXPECT_EQ(response->payload, absl::StrCat("call", i, "/pong"));
    ASSERT_EQ(response->storages.size(), 1u);
    EXPECT_TRUE(
        storage_matches(response->storages[0], 64, static_cast<uint8_t>(i)));
  }
}

TEST_P(AgentConformance, LargeStorageRoundTrip) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  constexpr size_t kBytes = 64 << 20;
  Message request = ping("big");
  request.storages.push_back(make_storage(kBytes, 7));
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), std::move(request), kBound).get();
  ASSERT_THAT(response, IsOk());
  ASSERT_EQ(response->storages.size(), 1u);
  EXPECT_TRUE(storage_matches(response->storages[0], kBytes, 7));
}

TEST_P(AgentConformance, HandlerErrorReachesSenderWithCodeAndText) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all([](Message) {
    return Future<Message>::ready(
        absl::InvalidArgumentError("the handler says no"));
  });
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), ping("x"), kBound).get();
  EXPECT_THAT(response, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("the handler says no")));
}

TEST_P(AgentConformance, UnknownPeerIsUnavailable) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  absl::StatusOr<Message> response =
      group[0].send(WorkerInfo{"nobody", 9}, ping("x"), kBound).get();
  EXPECT_THAT(response, StatusIs(absl::StatusCode::kUnavailable));
}

// A handler whose responses the test releases when it chooses.
class HeldResponses {
 public:
  Future<Message> hold(Message request) {
    Promise<Message> promise;
    absl::MutexLock lock(&mu_);
    held_.push_back({promise, std::move(request)});
    return promise.future();
  }

  void wait_for(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return held_.size() >= count;
    };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), kBound));
  }

  void release_all() {
    std::vector<std::pair<Promise<Message>, Message>> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (auto& [promise, request] : held) {
      Message response;
      response.type = MessageType::kPong;
      response.payload = request.payload + "/late";
      promise.set(std::move(response));
    }
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<Promise<Message>, Message>> held_ ABSL_GUARDED_BY(mu_);
};

TEST_P(AgentConformance, TimeoutFailsWithDeadlineExceeded) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  absl::Time start = absl::Now();
  absl::StatusOr<Message> response =
      group[0].send(group[1].self(), ping("slow"), absl::Milliseconds(200))
          .get(absl::Now() + kBound);
  EXPECT_THAT(response, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  // The late response is dropped harmlessly; the agent keeps working. (The
  // request may reach the handler after the timeout: wait for it first.)
  held->wait_for(1);
  held->release_all();
  Future<Message> next =
      group[0].send(group[1].self(), ping("next"), kBound);
  held->wait_for(1);
  held->release_all();
  absl::StatusOr<Message> second = next.get(absl::Now() + kBound);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->payload, "next/late");
}

TEST_P(AgentConformance, ShutdownCancelsPendingAndLaterSends) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  std::vector<Future<Message>> pending;
  for (int i = 0; i < 10; ++i) {
    pending.push_back(group[0].send(group[1].self(), ping("p"), kBound));
  }
  held->wait_for(10);
  group[0].shutdown();
  for (Future<Message>& future : pending) {
    EXPECT_THAT(future.get(absl::Now() + kBound),
                StatusIs(absl::StatusCode::kCancelled));
  }
  EXPECT_THAT(group[0].send(group[1].self(), ping("after"), kBound)
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled));
  // Responses to a shut-down sender are dropped without harm.
  held->release_all();
  group[0].shutdown();  // idempotent
}

TEST_P(AgentConformance, JoinWaitsForRequestsInFlight) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<HeldResponses>();
  group.start_all([held](Message request) { return held->hold(std::move(request)); });
  Future<Message> call = group[0].send(group[1].self(), ping("j"), kBound);
  held->wait_for(1);
  std::atomic<int> joined{0};
  std::vector<std::thread> joiners;
  std::vector<absl::Status> results(2);
  for (int rank = 0; rank < 2; ++rank) {
    joiners.emplace_back([&, rank] {
      results[rank] = group[rank].join(kBound);
      ++joined;
    });
  }
  // Both joiners are blocked by the held request; releasing it lets them go.
  EXPECT_FALSE(call.is_ready());
  EXPECT_EQ(joined.load(), 0);
  held->release_all();
  for (std::thread& joiner : joiners) joiner.join();
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], IsOk());
  ASSERT_THAT(call.get(absl::Now() + kBound), IsOk());
}

TEST_P(AgentConformance, JoinTimesOutWhenAPeerNeverJoins) {
  Group group(GetParam().backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  EXPECT_THAT(group[0].join(absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

}  // namespace
}  // namespace tether::testing
