// Creation and settings (testing/creation_conformance.h) on gRPC.
#include "backends/grpc/grpc_agent.h"
#include "testing/creation_conformance.h"

namespace {

tether::testing::CreationTraits grpc_traits() {
  tether::testing::CreationTraits traits =
      tether::testing::CreationTraits::listener(
          "grpc", [] { return tether::backends::grpc_backend(); },
          {"127.0.0.1:"});
  traits.bad_settings = {
      {"grpc.address", "no-such-interface0"},
      {"grpc.address", "0.0.0.0"},
      {"grpc.address", "[::1"},
      {"grpc.address", "127.0.0.1:70000"},
      {"grpc.tls_cert", "/no/such/file.pem"},
      // Incomplete TLS settings name the missing key.
      {"grpc.tls_cert", "/etc/hostname", {"grpc.tls_key"}},
      {"grpc.tls_mutual", "maybe"},
      {"grpc.tls_server_name", "worker"},  // without TLS
      {"grpc.keepalive_ms", "-1"},
      {"grpc.keepalive_timeout_ms", "0"},
      {"grpc.completion_threads", "0"},
      {"grpc.completion_threads", "65"},
      {"grpc.max_message_bytes", "0"},
      {"grpc.max_message_bytes", "lots"},
      {"grpc.chunk_bytes", "100"},
      {"grpc.init_timeout_ms", "soon"},
      {"grpc.auth_timeout_ms", "0"},
      {"grpc.adress", "127.0.0.1"},  // a typo of a known key
  };
  return traits;
}

}  // namespace

TETHER_CREATION_CONFORMANCE_TEST(Grpc, grpc_traits());
