// Peer authentication on libfabric: the shared checks of
// testing/auth_checks.h, over TCP (tcp;ofi_rxm) and shared memory (shm).
// RDM endpoints have no connections: the handshake runs per ordered peer
// pair at its first request (internal/frame.h).
#include <gtest/gtest.h>

#include "testing/auth_checks.h"

namespace tether::testing {
namespace {

const BackendSettings kTcp = {{"libfabric.provider", "tcp;ofi_rxm"}};
const BackendSettings kShm = {{"libfabric.provider", "shm"}};

TEST(LibfabricAuth, SameSecretWorksOverTcp) {
  expect_same_secret_works("libfabric", kTcp);
}

TEST(LibfabricAuth, WrongSecretIsRefusedOverTcp) {
  expect_wrong_secret_is_refused("libfabric", kTcp);
}

TEST(LibfabricAuth, MissingSecretIsRefusedOverTcp) {
  expect_missing_secret_is_refused("libfabric", kTcp);
}

TEST(LibfabricAuth, SameSecretWorksOverShm) {
  expect_same_secret_works("libfabric", kShm);
}

TEST(LibfabricAuth, WrongSecretIsRefusedOverShm) {
  expect_wrong_secret_is_refused("libfabric", kShm);
}

TEST(LibfabricAuth, MissingSecretIsRefusedOverShm) {
  expect_missing_secret_is_refused("libfabric", kShm);
}

}  // namespace
}  // namespace tether::testing
