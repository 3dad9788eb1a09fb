// Creation and settings (testing/creation_conformance.h) on libfabric, on
// its default provider (tcp;ofi_rxm).
#include "backends/libfabric/libfabric_agent.h"
#include "testing/creation_conformance.h"

namespace {

tether::testing::CreationTraits libfabric_traits() {
  tether::testing::CreationTraits traits;
  traits.backend = [] {
    return tether::backends::libfabric_backend(
        {{"libfabric.provider", "tcp;ofi_rxm"}});
  };
  traits.name = "libfabric";
  traits.bad_settings = {
      {"libfabric.rendezvous_threshold", "lots"},
      {"libfabric.rendezvous_threshold", "16"},
      {"libfabric.rendezvous_threshold", "-1"},
      {"libfabric.rendezvous", "dma"},
      {"libfabric.credits", "0"},
      {"libfabric.peer_timeout_ms", "5"},
      {"libfabric.init_timeout_ms", "soon"},
      {"libfabric.mr_cache_entries", "-3"},
      {"libfabric.spin_us", "1e3"},
      {"libfabric.provider", " "},
      {"libfabric.address", "no-such-interface0"},
      // A typo of a known key names the key it resembles.
      {"libfabric.threshold",
       "4096",
       {"libfabric.threshold", "libfabric.rendezvous_threshold"}},
  };
  traits.address_key = "libfabric.address";
  traits.init_timeout_key = "libfabric.init_timeout_ms";
  traits.address_record = {"provider=tcp;ofi_rxm\n",
                           "address=", "credits=16\n"};
  return traits;
}

}  // namespace

TETHER_CREATION_CONFORMANCE_TEST(Libfabric, libfabric_traits());
