#include "testing/auth_conformance.h"

#include <utility>

namespace tether::testing {

BackendSettings AuthConformance::settings() const {
  const AuthVariant& variant = GetParam().variant;
  return variant.settings ? variant.settings() : BackendSettings();
}

std::vector<AuthParam> auth_params(const AuthTraits& traits) {
  std::vector<AuthParam> params;
  for (const AuthVariant& variant : traits.variants) {
    params.push_back({traits.backend, variant});
  }
  return params;
}

namespace {

TEST_P(AuthConformance, SameSecretWorks) {
  expect_same_secret_works(GetParam().backend, settings());
}

TEST_P(AuthConformance, WrongSecretIsRefused) {
  expect_wrong_secret_is_refused(GetParam().backend, settings());
}

TEST_P(AuthConformance, MissingSecretIsRefused) {
  expect_missing_secret_is_refused(GetParam().backend, settings());
}

}  // namespace
}  // namespace tether::testing
