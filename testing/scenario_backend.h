// The backend the shared scenario tests (testing/scenarios/) run on, as
// their cc_test targets set it in the environment:
//
//   TETHER_TEST_BACKEND           the backend's registry name
//                                 (default "tensorpipe")
//   TETHER_TEST_BACKEND_SETTINGS  its settings, "key=value,key=value"
//                                 (default none), e.g.
//                                 "libfabric.provider=shm"
//
// Linking this library also skips every test of the binary, saying why,
// when that backend with those settings cannot run on this machine (it is
// not viable, or creating an agent fails with FAILED_PRECONDITION: a
// provider or device absent here), instead of failing them.
#ifndef TETHER_TESTING_SCENARIO_BACKEND_H_
#define TETHER_TESTING_SCENARIO_BACKEND_H_

#include <absl/container/flat_hash_map.h>

#include <string>

namespace tether::testing {

std::string backend_under_test();

// A malformed variable is a test failure (and yields what parsed).
absl::flat_hash_map<std::string, std::string> backend_settings_under_test();

}  // namespace tether::testing

#endif  // TETHER_TESTING_SCENARIO_BACKEND_H_
