// The agent conformance suite: one set of tests every backend passes.
//
// Linked once per backend as a one-line test (gRPC's event engine test suite
// is the model):
//
//   // backends/foo/foo_agent_test.cc
//   TETHER_AGENT_CONFORMANCE_TEST(Foo, tether::backends::foo_backend());
//
// Each test builds a group of agents of that backend in the test process,
// meeting through the real rendezvous (a memory:// store), installs its own
// request handler and checks the Agent contract of core/agent.h: requests
// and responses with storages, many in flight, large tensors, errors,
// timeouts, unknown peers, join, and shutdown with calls in flight.
// Multi-process backends also run the same checks across processes
// (testing/agent_conformance_multiprocess.h).
#ifndef TETHER_TESTING_AGENT_CONFORMANCE_H_
#define TETHER_TESTING_AGENT_CONFORMANCE_H_

#include <gtest/gtest.h>

#include "testing/agent_testing.h"

namespace tether::testing {

class AgentConformance : public ConformanceTest {};

}  // namespace tether::testing

#define TETHER_AGENT_CONFORMANCE_TEST(suite, backend_expr) \
  TETHER_INTERNAL_INSTANTIATE_CONFORMANCE(AgentConformance, suite, backend_expr)

#endif  // TETHER_TESTING_AGENT_CONFORMANCE_H_
