// The hostile-peer suite (testing/hostile_peers.h) on the gRPC backend.
#include "backends/grpc/grpc_agent.h"
#include "backends/grpc/grpc_testing.h"
#include "testing/hostile_peers.h"

TETHER_HOSTILE_PEERS_TEST(Grpc, tether::backends::grpc_backend(),
                          tether::backends::grpc_testing::hostile_dialect());
