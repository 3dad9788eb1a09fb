// Helpers for tests of agents (core/agent.h): recognisable messages, echo and
// refusing handlers, a handler whose responses the test releases (in this
// process or, by messages, in another), the parameter of the conformance
// suites, and agents meeting through the real rendezvous: a group of them in
// the test process over a memory:// store, or one per process over env://.
//
// Used by the agent conformance suites (testing/agent_conformance*.cc) and by
// the backend-specific tests (backends/*/*_backend_test.cc), so that all
// build their agents the same way.
#ifndef TETHER_TESTING_AGENT_TESTING_H_
#define TETHER_TESTING_AGENT_TESTING_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <c10/core/Storage.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/agent.h"
#include "core/backend_registry.h"
#include "core/future.h"
#include "core/message.h"
#include "core/rendezvous.h"

namespace tether::testing {

// How long one step of a test may take before it counts as hung.
inline constexpr absl::Duration kBound = absl::Seconds(30);

// Where backends differ in the agent area (testing/agent_conformance.h).
struct AgentTraits {
  // The agents' peers live apart, as in a multi-process backend, even when
  // the test puts them in one process: a peer may reach an agent before it
  // has started, and sees it shut down. Loopback does neither.
  bool remote_peers = false;
};

// The parameter of the conformance suites: the backend under test.
struct ConformanceParam {
  std::string label;
  std::function<Backend()> backend;
  AgentTraits traits;
};

// The fixture of both conformance suites: skips every test, saying why,
// when the backend is not viable on this machine (a provider or device
// absent here), instead of failing it.
class ConformanceTest : public ::testing::TestWithParam<ConformanceParam> {
 public:
  // Whether a backend with `traits` runs the suite (a suite of checks only
  // some backends pass hides this with its own).
  static bool wants(const AgentTraits&) { return true; }

 protected:
  void SetUp() override;
};

// Instantiates the conformance suite `fixture` for one backend with the
// traits `traits_expr`: the body of TETHER_AGENT_CONFORMANCE_TEST and its
// multi-process twin.
#define TETHER_INTERNAL_INSTANTIATE_CONFORMANCE(fixture, suite, backend_expr, \
                                                traits_expr)                  \
  namespace tether::testing {                                                \
  INSTANTIATE_TEST_SUITE_P(                                                  \
      suite, fixture,                                                        \
      ::testing::ValuesIn(conformance_params_where(                          \
          fixture::wants, {#suite, [] { return (backend_expr); },            \
                           (traits_expr)})),                                 \
      [](const auto& info) { return info.param.label; });                   \
  }  // namespace tether::testing

// `param` alone if `wants(param.traits)`, else nothing: a suite only some
// backends run is instantiated for the others with no tests.
std::vector<ConformanceParam> conformance_params_where(
    bool (*wants)(const AgentTraits&), ConformanceParam param);

// A byte storage whose contents follow from `seed`; storage_matches() checks
// one against the same size and seed.
c10::Storage make_storage(size_t nbytes, uint8_t seed);
bool storage_matches(const c10::Storage& storage, size_t nbytes, uint8_t seed);

// A PING request with `payload`.
Message ping(std::string payload);

// A request handler: PING -> PONG with the payload suffixed "/pong" and the
// same storages.
Future<Message> echo(Message request);

// A request handler that fails every request with INVALID_ARGUMENT
// "the handler says no".
Future<Message> refuse(Message request);

// The test's hold on a handler whose responses it releases: a HeldResponses
// in this process, or a RemoteHeld in another.
class HeldControl {
 public:
  virtual ~HeldControl() = default;

  // Waits (up to kBound) until `count` requests are held.
  virtual void wait_for(size_t count) = 0;

  // Answers every held request: PONG, the payload suffixed "/late".
  virtual void release_all() = 0;
};

// The payloads of the PING requests by which a RemoteHeld drives
// HeldResponses::hold_or_obey() in another process.
inline constexpr char kReleasePayload[] = "release";
inline constexpr char kHeldPrefix[] = "held:";

// A request handler whose responses the test releases when it chooses (or
// never). Thread-safe.
class HeldResponses final : public HeldControl {
 public:
  Future<Message> hold(Message request);

  // hold(), but for the requests of a RemoteHeld: PING "release" releases
  // every held request and is answered at once (echo), PING "held:N" is
  // answered (echo) once N requests are held. Neither is held.
  Future<Message> hold_or_obey(Message request);

  void wait_for(size_t count) override;
  void release_all() override;

 private:
  absl::Mutex mu_;
  std::vector<std::pair<Promise<Message>, Message>> held_ ABSL_GUARDED_BY(mu_);
  // "held:N" requests waiting for N held requests: N and their answer.
  std::vector<std::pair<size_t, Promise<Message>>> watchers_
      ABSL_GUARDED_BY(mu_);
};

// A HeldResponses serving with hold_or_obey() on `holder`, reached by
// messages sent through `from` (state is not shared across processes).
// Thread-compatible.
class RemoteHeld final : public HeldControl {
 public:
  RemoteHeld(Agent& from, WorkerInfo holder)
      : from_(from), holder_(std::move(holder)) {}

  void wait_for(size_t count) override;
  void release_all() override;

 private:
  Agent& from_;
  const WorkerInfo holder_;
};

using AgentSettings = absl::flat_hash_map<std::string, std::string>;

// Meets the group at `init_method` as worker "agent<rank>" of `size`
// (rendezvous() with the timeout kBound).
absl::StatusOr<RendezvousResult> meet_as_agent(const std::string& init_method,
                                               int rank, int size);

// Builds the agent of a worker that met its group as `member`, with
// `settings` (AgentSetup::settings), `limits` (AgentSetup::limits) and
// `busy_poll` (AgentSetup::poll, whatever the load).
absl::StatusOr<std::unique_ptr<Agent>> create_agent(
    const Backend& backend, const RendezvousResult& member,
    const AgentSettings& settings = {},
    const MessageLimits& limits = MessageLimits(),
    absl::Duration busy_poll = absl::ZeroDuration());

// Why one agent of `backend` with `settings`, alone in a group of one in this
// process, could not be created (OK if it was).
absl::Status create_status(const Backend& backend,
                           const AgentSettings& settings = {});

// `size` agents of one backend in this process, named "agent<rank>", meeting
// through rendezvous() on a fresh memory:// store. Every rank joins the
// rendezvous; only the ranks in `create` (all when empty) get an agent, each
// with `settings` (AgentSetup::settings) and its entry of `limits`
// (AgentSetup::limits; the defaults when `limits` is empty). The destructor
// shuts the agents down.
class AgentGroup {
 public:
  using Settings = AgentSettings;

  AgentGroup(const Backend& backend, int size, Settings settings = {},
             std::vector<int> create = {},
             std::vector<MessageLimits> limits = {});
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
            int rank, bool wanted, const Settings& settings,
            const MessageLimits& limits);

  std::vector<std::unique_ptr<Agent>> agents_;
  std::vector<absl::Status> errors_;
  std::shared_ptr<c10d::Store> store_;
};

}  // namespace tether::testing

#endif  // TETHER_TESTING_AGENT_TESTING_H_
