// The conformance areas that apply to the in-process loopback backend: the
// agent (testing/agent_conformance.h) and creation
// (testing/creation_conformance.h; it takes no settings and listens
// nowhere).
#include "backends/loopback/loopback_agent.h"

#include "testing/agent_conformance.h"
#include "testing/creation_conformance.h"

namespace {

tether::testing::CreationTraits loopback_traits() {
  return tether::testing::CreationTraits::of(
      "loopback", [] { return tether::backends::loopback_backend(); });
}

}  // namespace

TETHER_AGENT_CONFORMANCE_TEST(Loopback, tether::backends::loopback_backend(),
                              tether::testing::kLocalPeers);
TETHER_CREATION_CONFORMANCE_TEST(Loopback, loopback_traits());
