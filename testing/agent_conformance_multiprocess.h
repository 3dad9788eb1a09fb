// The agent conformance suite across processes, for multi-process backends.
//
// The checks of testing/agent_conformance.h, each run in 2 or 3 worker
// processes (testing/multiprocess.h) that meet through rendezvous("env://")
// as "agent<rank>" and build their agent with the backend under test. Rank 0
// is the process under test: it sends and asserts. The peers serve with the
// handler the test names (echo, refuse, or held responses that rank 0 waits
// for and releases by messages: nothing is shared across processes), then
// wait until rank 0 is done. One test kills a peer with SIGKILL to check
// that its pending requests fail with UNAVAILABLE in bounded time.
//
// Linked once per multi-process backend as a one-line test, beside the
// in-process suite:
//
//   // backends/foo/foo_agent_multiprocess_test.cc
//   TETHER_AGENT_CONFORMANCE_MULTIPROCESS_TEST(
//       Foo, tether::backends::foo_backend());
#ifndef TETHER_TESTING_AGENT_CONFORMANCE_MULTIPROCESS_H_
#define TETHER_TESTING_AGENT_CONFORMANCE_MULTIPROCESS_H_

#include <gtest/gtest.h>

#include "testing/agent_testing.h"

namespace tether::testing {

class AgentConformanceMultiprocess : public ConformanceTest {};

}  // namespace tether::testing

#define TETHER_AGENT_CONFORMANCE_MULTIPROCESS_TEST(suite, backend_expr) \
  TETHER_INTERNAL_INSTANTIATE_CONFORMANCE(AgentConformanceMultiprocess, \
                                          suite, backend_expr,          \
                                          ::tether::testing::AgentTraits{})

#endif  // TETHER_TESTING_AGENT_CONFORMANCE_MULTIPROCESS_H_
