// Peer authentication on gRPC: the shared checks of testing/auth_checks.h,
// as every backend runs them, on plaintext streams and inside mutual TLS.
#include <gtest/gtest.h>

#include "backends/grpc/grpc_testing.h"
#include "testing/auth_checks.h"

namespace tether::testing {
namespace {

TEST(GrpcAuth, SameSecretWorks) { expect_same_secret_works("grpc"); }

TEST(GrpcAuth, WrongSecretIsRefused) {
  expect_wrong_secret_is_refused("grpc");
}

TEST(GrpcAuth, MissingSecretIsRefused) {
  expect_missing_secret_is_refused("grpc");
}

// The 1 MiB tensors of the check in 4 KiB chunks, behind the handshake.
TEST(GrpcAuth, WithSmallChunks) {
  expect_same_secret_works("grpc", {{"grpc.chunk_bytes", "4096"}});
}

// Inside mutual TLS, every worker with the same certificate: the secret is
// checked on top of the certificates.
TEST(GrpcAuth, InsideMutualTls) {
  const backends::grpc_testing::Certificates certificates;
  ASSERT_FALSE(certificates.directory().empty());
  const BackendSettings tls = certificates.settings("worker");
  expect_same_secret_works("grpc", tls);
  expect_wrong_secret_is_refused("grpc", tls);
  expect_missing_secret_is_refused("grpc", tls);
}

}  // namespace
}  // namespace tether::testing
