// The agent conformance suite (testing/agent_conformance.h) on libfabric's
// tcp;ofi_rxm provider.
#include "backends/libfabric/libfabric_agent.h"
#include "testing/agent_conformance.h"

TETHER_AGENT_CONFORMANCE_TEST(LibfabricTcp,
                              tether::backends::libfabric_backend(
                                  {{"libfabric.provider", "tcp;ofi_rxm"}}),
                              tether::testing::kRemotePeers);
