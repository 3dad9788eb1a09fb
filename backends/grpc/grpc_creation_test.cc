// Creation and settings (testing/creation_conformance.h) on gRPC.
#include "backends/grpc/grpc_agent.h"
#include "testing/creation_conformance.h"

namespace {

tether::testing::CreationTraits grpc_traits() {
  return tether::testing::CreationTraits::listener(
             "grpc", [] { return tether::backends::grpc_backend(); },
             {"127.0.0.1:"})
      .reject("address",
              {"no-such-interface0", "0.0.0.0", "[::1", "127.0.0.1:70000"})
      .reject("tls_cert", {"/no/such/file.pem"})
      // Incomplete TLS settings name the missing key.
      .reject("tls_cert", "/etc/hostname", {"grpc.tls_key"})
      .reject("tls_mutual", {"maybe"})
      .reject("tls_server_name", {"worker"})  // without TLS
      .reject("keepalive_ms", {"-1"})
      .reject("keepalive_timeout_ms", {"0"})
      .reject("completion_threads", {"0", "65"})
      .reject("max_message_bytes", {"0", "lots"})
      .reject("chunk_bytes", {"100"})
      .reject("init_timeout_ms", {"soon"})
      .reject("auth_timeout_ms", {"0"})
      .reject("adress", {"127.0.0.1"});  // a typo of a known key
}

}  // namespace

TETHER_CREATION_CONFORMANCE_TEST(Grpc, grpc_traits());
