// The agent conformance suite (testing/agent_conformance.h) on libfabric's
// shm provider (one host).
#include "backends/libfabric/libfabric_agent.h"
#include "testing/agent_conformance.h"

TETHER_AGENT_CONFORMANCE_TEST(
    LibfabricShm,
    tether::backends::libfabric_backend({{"libfabric.provider", "shm"}}),
    tether::testing::kRemotePeers);
