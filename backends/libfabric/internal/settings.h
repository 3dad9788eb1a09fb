// The libfabric agent's settings, parsed from AgentSetup::settings (internal
// to the libfabric backend; the keys are documented in libfabric_agent.h).
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_SETTINGS_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_SETTINGS_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tether::backends::libfabric::internal {

// How the receiver of a large buffer pulls it.
enum class RendezvousMode {
  kAuto,    // fi_read where the provider has FI_RMA, else kTagged
  kRead,    // fi_read
  kTagged,  // the receiver posts tagged receives, then asks for the data
};

const char* rendezvous_mode_name(RendezvousMode mode);

// libfabric.peer_timeout_ms's default; a longer peer timeout replaces it
// (kLibfabricNames).
inline constexpr absl::Duration kPeerTimeout = absl::Seconds(10);

struct Settings {
  std::string provider = "tcp;ofi_rxm";
  std::string address = "127.0.0.1";
  // Whether the address was given (else a provider that cannot bind to the
  // default is left to its own choice).
  bool address_given = false;
  uint64_t rendezvous_threshold = 16 << 10;
  // Whether the threshold was given (else a provider may lower it).
  bool threshold_given = false;
  RendezvousMode rendezvous = RendezvousMode::kAuto;
  uint32_t credits = 16;
  absl::Duration peer_timeout = kPeerTimeout;
  absl::Duration init_timeout = absl::Seconds(60);
  // tcp providers: how long a connection accepted on the endpoint's
  // listener may take to make its connection request before it is reset.
  absl::Duration accept_timeout = absl::Seconds(5);
  size_t mr_cache_entries = 64;
  uint64_t mr_cache_bytes = uint64_t{256} << 20;
  // How long the progress thread keeps polling after its last work before
  // it sleeps.
  absl::Duration spin = absl::ZeroDuration();
};

// Keys that do not start with "libfabric." belong to other backends and are
// ignored. An unknown "libfabric.*" key or a bad value is INVALID_ARGUMENT
// naming the key.
[[nodiscard]] absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw);

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_SETTINGS_H_
