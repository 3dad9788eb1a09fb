#include "testing/scenario_backend.h"

#include <absl/status/status.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>

#include "backends/builtin.h"
#include "core/backend_registry.h"
#include "testing/agent_testing.h"
#include "testing/multiprocess.h"

namespace tether::testing {
namespace {

// Skips every test when the backend under test cannot run here. Checked
// once, in the test process (not again in the workers it starts).
class BackendAvailable : public ::testing::Environment {
 public:
  void SetUp() override {
    if (in_worker_process()) return;
    BackendRegistry registry;
    ASSERT_TRUE(backends::register_builtin_backends(registry).ok());
    absl::StatusOr<const Backend*> backend = registry.find(backend_under_test());
    ASSERT_TRUE(backend.ok()) << backend.status();
    absl::Status usable = (*backend)->viable();
    if (usable.ok()) {
      AgentGroup probe(**backend, 1, backend_settings_under_test());
      usable = probe.error(0);
    }
    if (usable.code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << "backend '" << backend_under_test()
                   << "' cannot run here: " << usable;
    }
  }
};

[[maybe_unused]] const auto* const kRegistered =
    ::testing::AddGlobalTestEnvironment(new BackendAvailable());

}  // namespace

std::string backend_under_test() {
  const char* backend = std::getenv("TETHER_TEST_BACKEND");
  return backend != nullptr ? backend : "tensorpipe";
}

absl::flat_hash_map<std::string, std::string> backend_settings_under_test() {
  absl::flat_hash_map<std::string, std::string> settings;
  const char* text = std::getenv("TETHER_TEST_BACKEND_SETTINGS");
  if (text == nullptr) return settings;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> pair =
        absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (pair.first.empty() || entry.find('=') == absl::string_view::npos) {
      ADD_FAILURE() << "TETHER_TEST_BACKEND_SETTINGS: '" << entry
                    << "' is not key=value";
      continue;
    }
    settings[std::string(pair.first)] = std::string(pair.second);
  }
  return settings;
}

}  // namespace tether::testing
