// Helpers for tests of agents (core/agent.h): recognisable messages, an echo
// handler, a handler whose responses the test releases, and a group of agents
// of one backend meeting in the test process.
//
// Used by the agent conformance suite (testing/agent_conformance.cc) and by
// the backend-specific tests (backends/*/*_backend_test.cc), so that both
// build their groups the same way: through the real rendezvous, over a
// memory:// store.
#ifndef TETHER_TESTING_AGENT_TESTING_H_
#define TETHER_TESTING_AGENT_TESTING_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <c10/core/Storage.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/agent.h"
#include "core/backend_registry.h"
#include "core/future.h"
#include "core/message.h"

namespace tether::testing {

// How long one step of a test may take before it counts as hung.
inline constexpr absl::Duration kBound = absl::Seconds(30);

// A byte storage whose contents follow from `seed`; storage_matches() checks
// one against the same size and seed.
c10::Storage make_storage(size_t nbytes, uint8_t seed);
bool storage_matches(const c10::Storage& storage, size_t nbytes, uint8_t seed);

// A PING request with `payload`.
Message ping(std::string payload);

// A request handler: PING -> PONG with the payload suffixed "/pong" and the
// same storages.
Future<Message> echo(Message request);

// A request handler whose responses the test releases when it chooses (or
// never). Thread-safe.
class HeldResponses {
 public:
  Future<Message> hold(Message request);

  // Waits (up to kBound) until `count` requests are held.
  void wait_for(size_t count);

  // Answers every held request: PONG, the payload suffixed "/late".
  void release_all();

 private:
  absl::Mutex mu_;
  std::vector<std::pair<Promise<Message>, Message>> held_ ABSL_GUARDED_BY(mu_);
};

// `size` agents of one backend in this process, named "agent<rank>", meeting
// through rendezvous() on a fresh memory:// store. Every rank joins the
// rendezvous; only the ranks in `create` (all when empty) get an agent, each
// with `settings` (AgentSetup::settings). The destructor shuts the agents
// down.
class AgentGroup {
 public:
  using Settings = absl::flat_hash_map<std::string, std::string>;

  AgentGroup(const Backend& backend, int size, Settings settings = {},
             std::vector<int> create = {});
  ~AgentGroup();
  AgentGroup(const AgentGroup&) = delete;
  AgentGroup& operator=(const AgentGroup&) = delete;

  // Success if every rank met the group and every wanted agent was created;
  // otherwise the errors, by rank.
  ::testing::AssertionResult ok() const;

  // Why `rank` failed to meet the group or to create its agent (OK if not).
  const absl::Status& error(int rank) const { return errors_[rank]; }

  // Only for a rank that has an agent.
  Agent& operator[](int rank) { return *agents_[rank]; }

  // The group's rendezvous store.
  c10d::Store& store() { return *store_; }

  // Starts every agent with `handler`.
  void start_all(const RequestHandler& handler);

 private:
  // On a thread of its own per rank: writes only that rank's slots (and
  // rank 0 the store).
  void meet(const Backend& backend, const std::string& init_method, int size,
            int rank, bool wanted, const Settings& settings);

  std::vector<std::unique_ptr<Agent>> agents_;
  std::vector<absl::Status> errors_;
  std::shared_ptr<c10d::Store> store_;
};

}  // namespace tether::testing

#endif  // TETHER_TESTING_AGENT_TESTING_H_
