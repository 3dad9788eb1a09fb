#include "backends/grpc/grpc_agent.h"
#include "testing/agent_conformance_multiprocess.h"

TETHER_AGENT_CONFORMANCE_MULTIPROCESS_TEST(Grpc,
                                           tether::backends::grpc_backend());
