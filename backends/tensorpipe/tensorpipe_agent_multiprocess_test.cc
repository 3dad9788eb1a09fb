#include "backends/tensorpipe/tensorpipe_agent.h"

#include "testing/agent_conformance_multiprocess.h"

TETHER_AGENT_CONFORMANCE_MULTIPROCESS_TEST(
    TensorPipe, tether::backends::tensorpipe_backend());
