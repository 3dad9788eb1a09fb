// Peer authentication (testing/auth_conformance.h) on TensorPipe: on the
// default transports, and over TCP only (no shared memory), where the
// handshake is the transport's too.
#include "testing/auth_conformance.h"

namespace {

tether::testing::AuthTraits tensorpipe_auth() {
  return {"tensorpipe",
          {{"Default", nullptr}, {"OverTcp", [] {
                                    return tether::testing::BackendSettings{
                                        {"tensorpipe.transports", "uv"}};
                                  }}}};
}

}  // namespace

TETHER_AUTH_CONFORMANCE_TEST(TensorPipe, tensorpipe_auth());
