// The agent conformance suite (testing/agent_conformance.h) on TensorPipe.
#include "backends/tensorpipe/tensorpipe_agent.h"

#include "testing/agent_conformance.h"

TETHER_AGENT_CONFORMANCE_TEST(TensorPipe,
                              tether::backends::tensorpipe_backend(),
                              tether::testing::kRemotePeers);
