// The agent conformance suite across processes on tcp;ofi_rxm.
#include "backends/libfabric/libfabric_agent.h"
#include "testing/agent_conformance_multiprocess.h"

TETHER_AGENT_CONFORMANCE_MULTIPROCESS_TEST(
    LibfabricTcp, tether::backends::libfabric_backend(
                      {{"libfabric.provider", "tcp;ofi_rxm"}}));
