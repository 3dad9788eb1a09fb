// The conformance areas that apply to the faulty backend wrapping loopback
// with no faults: the agent (testing/agent_conformance.h; everything is
// delegated, so the contract holds unchanged) and creation
// (testing/creation_conformance.h: its fault settings).
#include "backends/faulty/faulty_agent.h"

#include "backends/loopback/loopback_agent.h"
#include "core/backend_registry.h"
#include "testing/agent_conformance.h"
#include "testing/creation_conformance.h"

namespace {

// "faulty" with faulty.inner=loopback unless the settings name another.
tether::Backend faulty_over_loopback() {
  static const tether::BackendRegistry* const inner = [] {
    auto* registry = new tether::BackendRegistry;
    (void)registry->add(tether::backends::loopback_backend());
    return registry;
  }();
  tether::Backend backend = tether::backends::faulty_backend(inner);
  backend.create = [create = backend.create](tether::AgentSetup setup) {
    setup.settings.emplace("faulty.inner", "loopback");
    return create(std::move(setup));
  };
  return backend;
}

tether::testing::CreationTraits faulty_traits() {
  return tether::testing::CreationTraits::of("faulty", faulty_over_loopback)
      .reject("inner", {"faulty"})
      .reject("fail",
              {"RREF_USER_DELETE", "NO_SUCH_TYPE:1", "PING:1,PING:2", ""})
      .reject("drop", {"PING:-1", "PING:x"})
      .reject("delay", {"PING:1:2", "INVALID:5"})
      .reject("drop_bound_ms", {"0"})
      .reject("dorp", {"PING:1"});  // a typo of a known key
}

}  // namespace

TETHER_AGENT_CONFORMANCE_TEST(FaultyOverLoopback, faulty_over_loopback(),
                              tether::testing::kLocalPeers);
TETHER_CREATION_CONFORMANCE_TEST(FaultyOverLoopback, faulty_traits());
