// Peer authentication on TensorPipe: the shared checks of
// testing/auth_checks.h, on the default transports.
#include <gtest/gtest.h>

#include "testing/auth_checks.h"

namespace tether::testing {
namespace {

TEST(TensorPipeAuth, SameSecretWorks) {
  expect_same_secret_works("tensorpipe");
}

TEST(TensorPipeAuth, WrongSecretIsRefused) {
  expect_wrong_secret_is_refused("tensorpipe");
}

TEST(TensorPipeAuth, MissingSecretIsRefused) {
  expect_missing_secret_is_refused("tensorpipe");
}

// Over TCP only (no shared memory): the handshake is the transport's too.
TEST(TensorPipeAuth, OverTcp) {
  expect_same_secret_works("tensorpipe", {{"tensorpipe.transports", "uv"}});
  expect_wrong_secret_is_refused("tensorpipe",
                                 {{"tensorpipe.transports", "uv"}});
}

}  // namespace
}  // namespace tether::testing
