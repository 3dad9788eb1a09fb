#include "core/auth/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "testing/status_matchers.h"

namespace tether::auth {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr char kSecret[] = "0123456789abcdef-secret";

TEST(Auth, SecretFromOptionsThenEnvironmentElseNone) {
  ::unsetenv(kSecretEnv);
  absl::StatusOr<std::optional<Authenticator>> none = Authenticator::from("");
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->has_value());
  ::setenv(kSecretEnv, kSecret, 1);
  absl::StatusOr<std::optional<Authenticator>> env = Authenticator::from("");
  ASSERT_THAT(env, IsOk());
  EXPECT_TRUE(env->has_value());
  ::unsetenv(kSecretEnv);
  EXPECT_THAT(Authenticator::from("short"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at least 16 bytes")));
}

TEST(Auth, ProofsVerifyOnlyWithTheSameSecretAndBindings) {
  Authenticator a = **Authenticator::from(kSecret);
  Authenticator b = **Authenticator::from(kSecret);
  Authenticator other = **Authenticator::from("another-secret-of-16+");
  const std::string c1 = a.challenge(), c2 = a.challenge();
  EXPECT_EQ(c1.size(), kChallengeBytes);
  EXPECT_NE(c1, c2);
  const std::string proof = a.prove(Role::kClient, "w0", "w1", c1, c2);
  EXPECT_TRUE(b.verify(proof, Role::kClient, "w0", "w1", c1, c2));
  EXPECT_FALSE(other.verify(proof, Role::kClient, "w0", "w1", c1, c2));
  // Not reflectable, not transferable, not replayable.
  EXPECT_FALSE(b.verify(proof, Role::kServer, "w0", "w1", c1, c2));
  EXPECT_FALSE(b.verify(proof, Role::kClient, "w1", "w0", c1, c2));
  EXPECT_FALSE(b.verify(proof, Role::kClient, "w0", "w1", c2, c2));
  EXPECT_FALSE(b.verify(proof.substr(1), Role::kClient, "w0", "w1", c1, c2));
}

}  // namespace
}  // namespace tether::auth
