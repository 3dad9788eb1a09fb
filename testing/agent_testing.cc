#include "testing/agent_testing.h"

#include <absl/strings/str_cat.h>
#include <c10/core/CPUAllocator.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/rendezvous.h"
#include "testing/status_matchers.h"

namespace tether::testing {

namespace {

uint8_t byte_at(size_t index, uint8_t seed) {
  return static_cast<uint8_t>(seed + index * 31);
}

}  // namespace

c10::Storage make_storage(size_t nbytes, uint8_t seed) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::GetCPUAllocator(), /*resizable=*/false);
  auto* data = static_cast<uint8_t*>(storage.data());
  for (size_t i = 0; i < nbytes; ++i) data[i] = byte_at(i, seed);
  return storage;
}

bool storage_matches(const c10::Storage& storage, size_t nbytes, uint8_t seed) {
  if (storage.nbytes() != nbytes) return false;
  const auto* data = static_cast<const uint8_t*>(storage.data());
  for (size_t i = 0; i < nbytes; ++i) {
    if (data[i] != byte_at(i, seed)) return false;
  }
  return true;
}

Message ping(std::string payload) {
  Message message;
  message.type = MessageType::kPing;
  message.payload = std::move(payload);
  return message;
}

Future<Message> echo(Message request) {
  Message response;
  response.type = MessageType::kPong;
  response.payload = request.payload + "/pong";
  response.storages = std::move(request.storages);
  return Future<Message>::ready(std::move(response));
}

Future<Message> HeldResponses::hold(Message request) {
  Promise<Message> promise;
  absl::MutexLock lock(&mu_);
  held_.push_back({promise, std::move(request)});
  return promise.future();
}

void HeldResponses::wait_for(size_t count) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return held_.size() >= count;
  };
  ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), kBound));
}

void HeldResponses::release_all() {
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

AgentGroup::AgentGroup(const Backend& backend, int size, Settings settings,
                       std::vector<int> create) {
  static std::atomic<int> counter{0};
  const std::string init_method =
      absl::StrCat("memory://agent_testing_", counter++, "_", getpid());
  if (create.empty()) {
    for (int rank = 0; rank < size; ++rank) create.push_back(rank);
  }
  agents_.resize(size);
  errors_.resize(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    const bool wanted =
        std::find(create.begin(), create.end(), rank) != create.end();
    threads.emplace_back(
        [this, &backend, &init_method, size, rank, wanted, &settings] {
          meet(backend, init_method, size, rank, wanted, settings);
        });
  }
  for (std::thread& thread : threads) thread.join();
}

void AgentGroup::meet(const Backend& backend, const std::string& init_method,
                      int size, int rank, bool wanted,
                      const Settings& settings) {
  absl::StatusOr<RendezvousResult> group =
      rendezvous(init_method, absl::StrCat("agent", rank), rank, size, kBound);
  if (!group.ok()) {
    errors_[rank] = group.status();
    return;
  }
  if (rank == 0) store_ = group->store;
  if (!wanted) return;
  AgentSetup setup;
  setup.self = group->self;
  setup.workers = group->workers;
  setup.store = group->store;
  setup.group_key = group->group_key;
  setup.settings = settings;
  absl::StatusOr<std::unique_ptr<Agent>> agent =
      backend.create(std::move(setup));
  if (!agent.ok()) {
    errors_[rank] = agent.status();
    return;
  }
  agents_[rank] = *std::move(agent);
}

AgentGroup::~AgentGroup() {
  for (auto& agent : agents_) {
    if (agent) agent->shutdown();
  }
}

::testing::AssertionResult AgentGroup::ok() const {
  std::string errors;
  for (size_t rank = 0; rank < errors_.size(); ++rank) {
    if (!errors_[rank].ok()) {
      absl::StrAppend(&errors, "\n  rank ", rank, ": ",
                      errors_[rank].ToString());
    }
  }
  if (errors.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the group is incomplete:" << errors;
}

void AgentGroup::start_all(const RequestHandler& handler) {
  for (auto& agent : agents_) {
    if (agent) {
      ASSERT_THAT(agent->start(handler), IsOk());
    }
  }
}

}  // namespace tether::testing
