#include "backends/loopback/loopback_agent.h"
#include "testing/agent_conformance.h"

TETHER_AGENT_CONFORMANCE_TEST(Loopback, tether::backends::loopback_backend());
