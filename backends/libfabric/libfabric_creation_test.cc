// Creation and settings (testing/creation_conformance.h) on libfabric, on
// its default provider (tcp;ofi_rxm).
#include "backends/libfabric/libfabric_agent.h"
#include "testing/creation_conformance.h"

namespace {

tether::testing::CreationTraits libfabric_traits() {
  return tether::testing::CreationTraits::listener(
             "libfabric",
             [] {
               return tether::backends::libfabric_backend(
                   {{"libfabric.provider", "tcp;ofi_rxm"}});
             },
             {"provider=tcp;ofi_rxm\n", "address=", "credits=16\n"})
      .reject("rendezvous_threshold", {"lots", "16", "-1"})
      .reject("rendezvous", {"dma"})
      .reject("credits", {"0"})
      .reject("peer_timeout_ms", {"5"})
      .reject("init_timeout_ms", {"soon"})
      .reject("mr_cache_entries", {"-3"})
      .reject("spin_us", {"1e3"})
      .reject("provider", {" "})
      .reject("address", {"no-such-interface0"})
      // A typo of a known key names the key it resembles.
      .reject("threshold", "4096",
              {"libfabric.threshold", "libfabric.rendezvous_threshold"});
}

}  // namespace

TETHER_CREATION_CONFORMANCE_TEST(Libfabric, libfabric_traits());
