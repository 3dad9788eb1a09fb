// The gRPC agent's settings, parsed from AgentSetup::settings (internal to
// the gRPC backend; the keys are documented in backends/grpc/grpc_agent.h).
//
// Thread safety: parse_settings() is a pure function.
#ifndef TETHER_BACKENDS_GRPC_INTERNAL_SETTINGS_H_
#define TETHER_BACKENDS_GRPC_INTERNAL_SETTINGS_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <string>

namespace tether::backends::grpc::internal {

// The highest grpc.max_message_bytes: no agent sends a larger message, so a
// frame that announces one is not from an agent (internal/framing.h).
inline constexpr uint64_t kMaxMessageLimit = uint64_t{1} << 40;

struct TlsSettings {
  // PEM text read from the files the settings name. TLS is on when
  // `cert_chain` is set (then `private_key` and `root_certs` are too).
  std::string cert_chain;
  std::string private_key;
  std::string root_certs;
  bool mutual = true;
  // The name checked in a peer's server certificate; empty: its address.
  std::string server_name;

  bool enabled() const { return !cert_chain.empty(); }
};

// grpc.keepalive_timeout_ms's default; a longer peer timeout replaces it
// (kGrpcNames).
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(5);

struct Settings {
  // The host to listen on and publish: an IP literal (IPv6 in brackets).
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the kernel picks
  TlsSettings tls;
  // 0: no keepalive pings.
  absl::Duration keepalive = absl::Seconds(10);
  absl::Duration keepalive_timeout = kKeepaliveTimeout;
  // Completion queues, each driven by one thread of the agent. One: with
  // more, gRPC's poller hands each event to the queue's thread (twice the
  // context switches a call; docs/benchmarks.md).
  int completion_threads = 1;
  uint64_t max_message_bytes = uint64_t{1} << 31;
  uint64_t chunk_bytes = uint64_t{1} << 20;
  absl::Duration init_timeout = absl::Seconds(60);
  // A stream whose peer has not proven the shared secret this long after it
  // started is refused (a peer that never answers must not hold the link and
  // the requests queued on it).
  absl::Duration auth_timeout = absl::Seconds(20);
};

// Parses the "grpc.*" keys of `raw` (others belong to other backends).
// INVALID_ARGUMENT naming the key for an unknown key, a bad value, an
// unreadable file or an incomplete set of TLS files.
[[nodiscard]] absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw);

}  // namespace tether::backends::grpc::internal

#endif  // TETHER_BACKENDS_GRPC_INTERNAL_SETTINGS_H_
