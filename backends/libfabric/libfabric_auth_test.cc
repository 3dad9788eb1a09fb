// Peer authentication (testing/auth_conformance.h) on libfabric, over TCP
// (tcp;ofi_rxm) and shared memory (shm). RDM endpoints have no
// connections: the handshake runs per ordered peer pair at its first
// request (internal/framing.h).
#include "testing/auth_conformance.h"

namespace {

using ::tether::testing::BackendSettings;

tether::testing::AuthTraits libfabric_auth() {
  return {"libfabric",
          {{"OverTcp",
            [] {
              return BackendSettings{{"libfabric.provider", "tcp;ofi_rxm"}};
            }},
           {"OverShm", [] {
              return BackendSettings{{"libfabric.provider", "shm"}};
            }}}};
}

}  // namespace

TETHER_AUTH_CONFORMANCE_TEST(Libfabric, libfabric_auth());
