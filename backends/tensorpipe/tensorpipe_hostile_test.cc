// The hostile-peer suite on TensorPipe (its guarded tcp transport).
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "testing/hostile_peers.h"

TETHER_HOSTILE_PEERS_TEST(TensorPipe, tether::backends::tensorpipe_backend(),
                          tether::testing::HostileDialect{});
