// The agent conformance suite across processes on shm.
#include "backends/libfabric/libfabric_agent.h"
#include "testing/agent_conformance_multiprocess.h"

TETHER_AGENT_CONFORMANCE_MULTIPROCESS_TEST(
    LibfabricShm,
    tether::backends::libfabric_backend({{"libfabric.provider", "shm"}}));
