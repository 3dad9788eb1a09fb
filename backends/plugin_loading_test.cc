// The gRPC backend is a plugin (backends/common/plugin_library.h): a
// program over the built-in registry maps gRPC's libraries only once a
// worker chooses "grpc", and then calls work through it. Each case runs in
// a fresh process (a "threadsafe" death test re-executes this binary), so
// what one case loads cannot hide what another does not.
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "backends/builtin.h"
#include "backends/common/plugin_abi.h"
#include "backends/common/plugin_library.h"
#include "core/backend_registry.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::backends {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::testing::AgentGroup;
using ::tether::testing::echo;
using ::tether::testing::kBound;
using ::tether::testing::ping;

// Whether this process maps a file whose name starts with `prefix`.
bool maps_library(absl::string_view prefix) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.rfind('/');
    if (slash == std::string::npos) continue;
    if (absl::string_view(line).substr(slash + 1).substr(0, prefix.size()) ==
        prefix) {
      return true;
    }
  }
  return false;
}

// Two agents of `backend` from the built-in registry make one call; then
// whether gRPC's libraries are mapped must be `grpc_expected`.
absl::Status call_through_registry(const std::string& backend,
                                   bool grpc_expected) {
  BackendRegistry registry;
  if (absl::Status added = register_builtin_backends(registry); !added.ok()) {
    return added;
  }
  if (maps_library("libgrpc") || maps_library("libtether_grpc")) {
    return absl::InternalError("gRPC is mapped before any agent exists");
  }
  absl::StatusOr<const Backend*> found = registry.find(backend);
  if (!found.ok()) return found.status();
  if (absl::Status viable = (*found)->viable(); !viable.ok()) return viable;
  {
    AgentGroup group(**found, 2);
    if (!group.ok()) return absl::InternalError(group.ok().message());
    group.start_all(echo);
    absl::StatusOr<Message> answer =
        group[0]
            .send(group[1].self(), ping("through the registry"), kBound)
            .get(absl::Now() + kBound);
    if (!answer.ok()) return answer.status();
    if (answer->payload != "through the registry/pong") {
      return absl::InternalError(
          absl::StrCat("the echo answered '", answer->payload, "'"));
    }
  }
  for (absl::string_view library :
       {"libgrpc.so", "libgrpc++.so", "libgpr.so", "libtether_grpc.so"}) {
    if (maps_library(library) != grpc_expected) {
      return absl::InternalError(
          absl::StrCat("after a call over ", backend, ", ", library, " is ",
                       grpc_expected ? "not mapped" : "mapped"));
    }
  }
  return absl::OkStatus();
}

// In the death test's child: exit 0 if `status` is OK, else print it (on
// stdout too, which the test's log keeps where gtest may not show stderr).
[[noreturn]] void exit_with(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    std::fprintf(stdout, "in the child: %s\n", status.ToString().c_str());
  }
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(status.ok() ? 0 : 1);
}

class PluginLoadingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  }
};

TEST_F(PluginLoadingTest, TensorpipeWorkerMapsNoGrpc) {
  EXPECT_EXIT(exit_with(call_through_registry("tensorpipe", false)),
              ::testing::ExitedWithCode(0), "");
}

TEST_F(PluginLoadingTest, GrpcIsLoadedWhenChosenAndCalls) {
  EXPECT_EXIT(exit_with(call_through_registry("grpc", true)),
              ::testing::ExitedWithCode(0), "");
}

// A plugin that is nowhere: NOT_FOUND naming every path tried and the
// variable that points at it.
TEST(PluginLibraryTest, MissingPluginNamesEveryPathTried) {
  const common::PluginLibrary library{"the absent backend",
                                      "libtether_absent.so", "backends/absent",
                                      "tether_absent_backend"};
  absl::StatusOr<const Backend*> loaded =
      common::load_plugin_backend("absent", library);
  ASSERT_THAT(loaded, testing::StatusIs(absl::StatusCode::kNotFound,
                                        HasSubstr("TETHER_PLUGIN_DIR")));
  for (const std::string& path : common::plugin_candidates(library)) {
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(path));
  }
  const Backend backend = common::plugin_backend("absent", library);
  EXPECT_THAT(backend.viable(),
              testing::StatusIs(absl::StatusCode::kNotFound,
                                HasSubstr("libtether_absent.so")));
}

// A file of that name that is not a library: FAILED_PRECONDITION with
// dlerror's text, first in the order (TETHER_PLUGIN_DIR).
TEST(PluginLibraryTest, BrokenPluginIsRefusedWithDlerror) {
  std::string dir = ::testing::TempDir() + "plugin_loading_test.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string file = absl::StrCat(dir, "/libtether_broken.so");
  std::ofstream(file) << "not a shared library\n";
  ASSERT_EQ(::setenv("TETHER_PLUGIN_DIR", dir.c_str(), 1), 0);
  const common::PluginLibrary library{"the broken backend",
                                      "libtether_broken.so", "backends/broken",
                                      "tether_broken_backend"};
  EXPECT_EQ(common::plugin_candidates(library).front(), file);
  absl::StatusOr<const Backend*> loaded =
      common::load_plugin_backend("broken", library);
  EXPECT_THAT(loaded, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr(file + ": " + file)));
  ::unsetenv("TETHER_PLUGIN_DIR");
  ::unlink(file.c_str());
  ::rmdir(dir.c_str());
}

// Loads the backend `name` from libtether_stale_plugin.so's `entry`.
absl::StatusOr<const Backend*> load_test_plugin(const std::string& name,
                                                const std::string& entry) {
  return common::load_plugin_backend(
      name,
      {"the test backend", "libtether_stale_plugin.so", "backends", entry});
}

// A plugin of another build (its entry point answers with its own ABI id)
// is refused, naming both ids.
TEST(PluginLibraryTest, PluginOfAnotherBuildIsRefused) {
  EXPECT_THAT(load_test_plugin("stale", "tether_stale_backend"),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                AllOf(HasSubstr("another build"),
                                      HasSubstr("0123456789abcdef"),
                                      HasSubstr(TETHER_PLUGIN_ABI_ID))));
}

// A plugin that holds another backend than the one registered under its
// name is refused, and closed.
TEST(PluginLibraryTest, PluginOfAnotherBackendIsRefused) {
  EXPECT_THAT(load_test_plugin("misnamed", "tether_misnamed_backend"),
              testing::StatusIs(
                  absl::StatusCode::kFailedPrecondition,
                  HasSubstr("holds the backend 'other', not 'misnamed'")));
}

// The plugin's side of the same check: another id gets this build's back,
// and the backend is left as it was.
TEST(PluginLibraryTest, EntryPointRefusesAnotherAbiId) {
  Backend made;
  made.name = "made";
  Backend out;
  out.name = "untouched";
  const common::PluginHost host{&message_type_name};
  EXPECT_STREQ(common::answer_plugin("0123456789abcdef", &host, made, &out),
               TETHER_PLUGIN_ABI_ID);
  EXPECT_EQ(out.name, "untouched");
  EXPECT_EQ(common::answer_plugin(TETHER_PLUGIN_ABI_ID, &host, made, &out),
            nullptr);
  EXPECT_EQ(out.name, "made");
}

}  // namespace
}  // namespace tether::backends
