// Creation and settings (testing/creation_conformance.h) on TensorPipe.
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "testing/creation_conformance.h"

namespace {

tether::testing::CreationTraits tensorpipe_traits() {
  // By default only tether's guarded tcp transport listens (issue #16).
  tether::testing::CreationTraits traits =
      tether::testing::CreationTraits::listener(
          "tensorpipe", [] { return tether::backends::tensorpipe_backend(); },
          {"tcp=127.0.0.1:"});
  traits.bad_settings = {
      {"tensorpipe.transports",
       "uv,carrier_pigeon",
       {"tensorpipe.transports", "carrier_pigeon"}},
      {"tensorpipe.channels",
       "basic,cuda_ipc",
       {"tensorpipe.channels", "cuda_ipc"}},
      {"tensorpipe.transports", " , "},
      {"tensorpipe.mpt_lanes", "0"},
      {"tensorpipe.mpt_lanes", "two"},
      {"tensorpipe.init_timeout_ms", "-5"},
      {"tensorpipe.address", "no-such-interface0"},
      {"tensorpipe.transport", "uv"},  // a typo of a known key
  };
  return traits;
}

}  // namespace

TETHER_CREATION_CONFORMANCE_TEST(TensorPipe, tensorpipe_traits());
