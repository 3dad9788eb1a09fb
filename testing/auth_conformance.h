// The authentication area of the conformance suite: the checks
// of testing/auth_checks.h (same secret works, a wrong or missing secret is
// refused naming the peer) on workers of the backend under test, once per
// variant of its settings where the handshake travels differently (another
// transport or provider, small chunks, inside TLS).
//
// Linked once per backend as a one-line test:
//
//   // backends/foo/foo_auth_test.cc
//   TETHER_AUTH_CONFORMANCE_TEST(Foo, tether::testing::AuthTraits{
//       "foo", {{"Default", {}}, {"OverTcp", [] { return ...; }}}});
//
// Test names: <Suite>/AuthConformance.<Check>/<Variant>.
#ifndef TETHER_TESTING_AUTH_CONFORMANCE_H_
#define TETHER_TESTING_AUTH_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "testing/auth_checks.h"

namespace tether::testing {

// Settings the checks run under, made when the test runs (a variant may
// need files made at test time, such as certificates); an empty function
// means none.
struct AuthVariant {
  std::string label;
  std::function<BackendSettings()> settings;
};

// Where a backend differs in this area.
struct AuthTraits {
  std::string backend;  // its name in the registry
  std::vector<AuthVariant> variants;
};

// The parameter of the suite: one variant of one backend.
struct AuthParam {
  std::string backend;
  AuthVariant variant;

  friend void PrintTo(const AuthParam& param, std::ostream* out) {
    *out << param.backend << "/" << param.variant.label;
  }
};

class AuthConformance : public ::testing::TestWithParam<AuthParam> {
 protected:
  BackendSettings settings() const;
};

// One parameter per variant of `traits`.
std::vector<AuthParam> auth_params(const AuthTraits& traits);

}  // namespace tether::testing

#define TETHER_AUTH_CONFORMANCE_TEST(suite, traits_expr)                  \
  namespace tether::testing {                                             \
  INSTANTIATE_TEST_SUITE_P(suite, AuthConformance,                        \
                           ::testing::ValuesIn(auth_params(traits_expr)), \
                           [](const auto& info) {                         \
                             return info.param.variant.label;             \
                           });                                            \
  }  // namespace tether::testing

#endif  // TETHER_TESTING_AUTH_CONFORMANCE_H_
