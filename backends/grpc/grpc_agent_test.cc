// The agent conformance suite (testing/agent_conformance.h) on gRPC.
#include "backends/grpc/grpc_agent.h"

#include "testing/agent_conformance.h"

TETHER_AGENT_CONFORMANCE_TEST(Grpc, tether::backends::grpc_backend(),
                              tether::testing::kRemotePeers);
