#include "backends/tensorpipe/tensorpipe_agent.h"

#include "testing/agent_conformance.h"

TETHER_AGENT_CONFORMANCE_TEST(TensorPipe,
                              tether::backends::tensorpipe_backend());
