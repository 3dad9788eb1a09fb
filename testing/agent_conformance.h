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
#ifndef TETHER_TESTING_AGENT_CONFORMANCE_H_
#define TETHER_TESTING_AGENT_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/backend_registry.h"

namespace tether::testing {

struct ConformanceParam {
  std::string label;
  std::function<Backend()> backend;
};

class AgentConformance : public ::testing::TestWithParam<ConformanceParam> {};

}  // namespace tether::testing

#define TETHER_AGENT_CONFORMANCE_TEST(suite, backend_expr)           \
  namespace tether::testing {                                       \
  INSTANTIATE_TEST_SUITE_P(                                         \
      suite, AgentConformance,                                      \
      ::testing::Values(ConformanceParam{                           \
          #suite, [] { return (backend_expr); }}),                  \
      [](const auto& info) { return info.param.label; });          \
  }  // namespace tether::testing

#endif  // TETHER_TESTING_AGENT_CONFORMANCE_H_
