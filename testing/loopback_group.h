// A group of workers in one process, for the tests of the layers above core
// (rref, autograd, optim): their semantics run first over the in-process
// loopback agent (or a backend wrapping it, e.g. faulty), as Cap'n Proto's
// rpc-test runs its RPC system over an in-memory network.
//
//   class RRefs : public tether::testing::LoopbackGroup {
//    protected:
//     void SetUp() override {
//       start(group_options("rref_test"), {"alice", "bob"},
//             {tether::rref_extension()});
//     }
//   };
//
// start_group and shutdown_group serve fixtures that cannot derive from
// LoopbackGroup (parameterised ones) and programs such as benchmarks.
#ifndef TETHER_TESTING_LOOPBACK_GROUP_H_
#define TETHER_TESTING_LOOPBACK_GROUP_H_

#include <absl/status/status.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/backend_registry.h"
#include "core/worker.h"

namespace tether::testing {

// The bound of every wait in a group's tests.
inline constexpr absl::Duration kGroupBound = absl::Seconds(30);

// Options of a new group over `loopback`: an init method
// "memory://<prefix>_<n>" no other group of this process uses,
// `threads` pool threads, and kGroupBound as the default timeout.
RpcOptions group_options(absl::string_view prefix, int threads = 8);

// The workers of one group in this process, one per name (ranks in order),
// built concurrently from `registry` (the builtin backends when omitted)
// with `options` and `extensions`. On error a test failure naming the
// worker, and the slots of the workers that failed stay null.
std::vector<std::unique_ptr<Worker>> start_group(
    const BackendRegistry& registry, const RpcOptions& options,
    const std::vector<std::string>& names,
    const std::vector<ExtensionFactory>& extensions);
std::vector<std::unique_ptr<Worker>> start_group(
    const RpcOptions& options, const std::vector<std::string>& names,
    const std::vector<ExtensionFactory>& extensions);

// Shuts every (non-null) worker down gracefully and concurrently; the first
// error, naming its worker, or OK.
[[nodiscard]] absl::Status shutdown_group(
    std::vector<std::unique_ptr<Worker>>& workers);

// A fixture holding one group: start() it in SetUp; TearDown shuts it down
// and expects success.
class LoopbackGroup : public ::testing::Test {
 protected:
  // Starts the group; a fatal test failure unless every worker started.
  void start(const RpcOptions& options, const std::vector<std::string>& names,
             const std::vector<ExtensionFactory>& extensions);

  void TearDown() override;

  Worker& worker(size_t rank) { return *workers_[rank]; }

  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace tether::testing

#endif  // TETHER_TESTING_LOOPBACK_GROUP_H_
