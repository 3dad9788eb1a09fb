#include "testing/agent_testing.h"

#include <absl/strings/strip.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <c10/core/CPUAllocator.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <thread>

#include "testing/status_matchers.h"

namespace tether::testing {

namespace {

uint8_t byte_at(size_t index, uint8_t seed) {
  return static_cast<uint8_t>(seed + index * 31);
}

}  // namespace

void ConformanceTest::SetUp() {
  const absl::Status viable = GetParam().backend().viable();
  if (!viable.ok()) {
    GTEST_SKIP() << GetParam().label << " is not viable here: " << viable;
  }
}

std::vector<ConformanceParam> conformance_params_where(
    bool (*wants)(const AgentTraits&), ConformanceParam param) {
  if (!wants(param.traits)) return {};
  return {std::move(param)};
}

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

Future<Message> refuse(Message) {
  return Future<Message>::ready(
      absl::InvalidArgumentError("the handler says no"));
}

Future<Message> HeldResponses::hold(Message request) {
  Promise<Message> promise;
  std::vector<std::pair<size_t, Promise<Message>>> satisfied;
  {
    absl::MutexLock lock(&mu_);
    held_.push_back({promise, std::move(request)});
    const size_t held = held_.size();
    auto waiting = std::partition(
        watchers_.begin(), watchers_.end(),
        [held](const auto& watcher) { return watcher.first > held; });
    satisfied.assign(std::make_move_iterator(waiting),
                     std::make_move_iterator(watchers_.end()));
    watchers_.erase(waiting, watchers_.end());
  }
  // Outside the lock: the agent sends these answers from their callbacks.
  for (auto& [count, answer] : satisfied) {
    answer.set(echo(ping(absl::StrCat(kHeldPrefix, count))).result());
  }
  return promise.future();
}

Future<Message> HeldResponses::hold_or_obey(Message request) {
  if (request.type != MessageType::kPing) return hold(std::move(request));
  if (request.payload == kReleasePayload) {
    release_all();
    return echo(std::move(request));
  }
  absl::string_view number = request.payload;
  size_t count = 0;
  if (!absl::ConsumePrefix(&number, kHeldPrefix) ||
      !absl::SimpleAtoi(number, &count)) {
    return hold(std::move(request));
  }
  Promise<Message> answer;
  {
    absl::MutexLock lock(&mu_);
    if (held_.size() < count) {
      watchers_.push_back({count, answer});
      return answer.future();
    }
  }
  return echo(std::move(request));
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

void RemoteHeld::wait_for(size_t count) {
  const std::string payload = absl::StrCat(kHeldPrefix, count);
  ASSERT_THAT(
      from_.send(holder_, ping(payload), kBound).get(absl::Now() + kBound),
      IsOk())
      << "waiting for " << count << " requests held by " << holder_.name;
}

void RemoteHeld::release_all() {
  ASSERT_THAT(from_.send(holder_, ping(kReleasePayload), kBound)
                  .get(absl::Now() + kBound),
              IsOk())
      << "releasing the requests held by " << holder_.name;
}

absl::StatusOr<RendezvousResult> meet_as_agent(const std::string& init_method,
                                               int rank, int size) {
  return rendezvous(init_method, absl::StrCat("agent", rank), rank, size,
                    kBound);
}

absl::StatusOr<std::unique_ptr<Agent>> create_agent(
    const Backend& backend, const RendezvousResult& member,
    const AgentSettings& settings, const MessageLimits& limits,
    absl::Duration busy_poll) {
  AgentSetup setup;
  setup.self = member.self;
  setup.workers = member.workers;
  setup.store = member.store;
  setup.group_key = member.group_key;
  setup.settings = settings;
  setup.limits = limits;
  setup.poll = PollPolicy{busy_poll, /*only_on_spare_cores=*/false};
  return backend.create(std::move(setup));
}

absl::Status create_status(const Backend& backend,
                           const AgentSettings& settings) {
  AgentGroup group(backend, 1, settings);
  return group.error(0);
}

AgentGroup::AgentGroup(const Backend& backend, int size, Settings settings,
                       std::vector<int> create,
                       std::vector<MessageLimits> limits) {
  static std::atomic<int> counter{0};
  const std::string init_method =
      absl::StrCat("memory://agent_testing_", counter++, "_", getpid());
  if (create.empty()) {
    for (int rank = 0; rank < size; ++rank) create.push_back(rank);
  }
  agents_.resize(size);
  errors_.resize(size);
  limits.resize(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    const bool wanted =
        std::find(create.begin(), create.end(), rank) != create.end();
    threads.emplace_back([this, &backend, &init_method, size, rank, wanted,
                          &settings, &limits] {
      meet(backend, init_method, size, rank, wanted, settings, limits[rank]);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

void AgentGroup::meet(const Backend& backend, const std::string& init_method,
                      int size, int rank, bool wanted,
                      const Settings& settings, const MessageLimits& limits) {
  absl::StatusOr<RendezvousResult> group =
      meet_as_agent(init_method, rank, size);
  if (!group.ok()) {
    errors_[rank] = group.status();
    return;
  }
  if (rank == 0) store_ = group->store;
  if (!wanted) return;
  absl::StatusOr<std::unique_ptr<Agent>> agent =
      create_agent(backend, *group, settings, limits);
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
