// The agent conformance suite on the faulty backend wrapping loopback with no
// faults: everything is delegated, so the contract holds unchanged.
#include "backends/faulty/faulty_agent.h"

#include "backends/loopback/loopback_agent.h"
#include "core/backend_registry.h"
#include "testing/agent_conformance.h"

namespace {

// "faulty" with faulty.inner=loopback (the suite passes no settings).
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

}  // namespace

TETHER_AGENT_CONFORMANCE_TEST(FaultyOverLoopback, faulty_over_loopback());
