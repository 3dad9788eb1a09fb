// Peer authentication (testing/auth_conformance.h) on gRPC: on plaintext
// streams, with the 1 MiB tensors of the checks in 4 KiB chunks behind the
// handshake, and inside mutual TLS (every worker with the same
// certificate: the secret is checked on top of the certificates).
#include "backends/grpc/grpc_testing.h"
#include "testing/auth_conformance.h"

namespace {

using ::tether::testing::BackendSettings;

BackendSettings mutual_tls() {
  // Made once, by the first test that needs them; kept for the process.
  static const auto* const certificates =
      new tether::backends::grpc_testing::Certificates;
  EXPECT_FALSE(certificates->directory().empty());
  return certificates->settings("worker");
}

tether::testing::AuthTraits grpc_auth() {
  return {"grpc",
          {{"Default", nullptr},
           {"WithSmallChunks",
            [] {
              return BackendSettings{{"grpc.chunk_bytes", "4096"}};
            }},
           {"InsideMutualTls", mutual_tls}}};
}

}  // namespace

TETHER_AUTH_CONFORMANCE_TEST(Grpc, grpc_auth());
