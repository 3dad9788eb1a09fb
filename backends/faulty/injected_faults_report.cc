// Linked into a fault test (//backends/faulty:injected_faults_report), this
// prints, when the test binary's suites end, how many faults its faulty
// agents injected in this process, so that a passing test's log says how many
// faults it survived.
#include <gtest/gtest.h>

#include <cstdio>

#include "backends/faulty/faulty_agent.h"

namespace tether::backends {
namespace {

class InjectedFaultsReport : public ::testing::Environment {
 public:
  void TearDown() override {
    const InjectedFaults faults = injected_faults();
    std::printf("faults injected in this process: %lld failed, %lld dropped, "
                "%lld delayed sends\n",
                static_cast<long long>(faults.failed),
                static_cast<long long>(faults.dropped),
                static_cast<long long>(faults.delayed));
  }
};

const auto* const kReport =
    ::testing::AddGlobalTestEnvironment(new InjectedFaultsReport);

}  // namespace
}  // namespace tether::backends
