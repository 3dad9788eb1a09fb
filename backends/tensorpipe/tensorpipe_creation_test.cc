// Creation and settings (testing/creation_conformance.h) on TensorPipe.
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "testing/creation_conformance.h"

namespace {

tether::testing::CreationTraits tensorpipe_traits() {
  // By default only tether's guarded tcp transport listens.
  return tether::testing::CreationTraits::listener(
             "tensorpipe",
             [] { return tether::backends::tensorpipe_backend(); },
             {"tcp=127.0.0.1:"})
      .reject("transports", "uv,carrier_pigeon",
              {"tensorpipe.transports", "carrier_pigeon"})
      .reject("channels", "basic,cuda_ipc", {"tensorpipe.channels", "cuda_ipc"})
      .reject("transports", {" , "})
      .reject("mpt_lanes", {"0", "two"})
      .reject("init_timeout_ms", {"-5"})
      .reject("address", {"no-such-interface0"})
      .reject("transport", {"uv"});  // a typo of a known key
}

}  // namespace

TETHER_CREATION_CONFORMANCE_TEST(TensorPipe, tensorpipe_traits());
