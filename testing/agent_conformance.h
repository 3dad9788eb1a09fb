// The agent area of the conformance suite: one set of tests of the Agent
// contract (core/agent.h) every backend passes.
//
// Linked once per backend as a one-line test (gRPC's event engine test suite
// is the model):
//
//   // backends/foo/foo_agent_test.cc
//   TETHER_AGENT_CONFORMANCE_TEST(Foo, tether::backends::foo_backend(),
//                                 tether::testing::kRemotePeers);
//
// Each test builds a group of agents of that backend in the test process,
// meeting through the real rendezvous (a memory:// store), installs its own
// request handler and checks the contract: requests and responses with
// storages, many in flight, large tensors, errors, timeouts, unknown peers,
// join, and shutdown with calls in flight (AgentConformance). Backends whose
// peers live apart (AgentTraits::remote_peers: the multi-process ones) also
// run RemotePeerConformance: requests that arrive before start(), a peer
// that shuts down. Multi-process backends run the same checks across
// processes too (testing/agent_conformance_multiprocess.h); the other areas
// are creation and settings (testing/creation_conformance.h), peer
// authentication (testing/auth_conformance.h) and hostile peers
// (testing/hostile_peers.h).
#ifndef TETHER_TESTING_AGENT_CONFORMANCE_H_
#define TETHER_TESTING_AGENT_CONFORMANCE_H_

#include <gtest/gtest.h>

#include "testing/agent_testing.h"

namespace tether::testing {

// The traits of an in-process backend (loopback) and of one whose peers
// live apart.
inline const AgentTraits kLocalPeers{/*remote_peers=*/false};
inline const AgentTraits kRemotePeers{/*remote_peers=*/true};

class AgentConformance : public ConformanceTest {};

class RemotePeerConformance : public ConformanceTest {
 public:
  static bool wants(const AgentTraits& traits) { return traits.remote_peers; }
};

}  // namespace tether::testing

#define TETHER_AGENT_CONFORMANCE_TEST(suite, backend_expr, traits_expr)       \
  TETHER_INTERNAL_INSTANTIATE_CONFORMANCE(AgentConformance, suite,            \
                                          backend_expr, traits_expr)          \
  TETHER_INTERNAL_INSTANTIATE_CONFORMANCE(RemotePeerConformance, suite,       \
                                          backend_expr, traits_expr)

#endif  // TETHER_TESTING_AGENT_CONFORMANCE_H_
