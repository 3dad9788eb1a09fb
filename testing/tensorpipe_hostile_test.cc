// The hostile-peer suite on TensorPipe (see BUILD.bazel: manual for now).
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "testing/hostile_peers.h"

TETHER_HOSTILE_PEERS_TEST(TensorPipe, tether::backends::tensorpipe_backend(),
                          tether::testing::HostileDialect{});
