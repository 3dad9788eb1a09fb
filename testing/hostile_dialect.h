// What a backend's own wire protocol adds to the hostile-peer suite
// (testing/hostile_peers.h): bytes in its format, and a client of its
// transport where a raw TCP client cannot reach its framing.
//
// Apart from the suite so that a backend's test helpers can build one
// without linking the suite's tests.
#ifndef TETHER_TESTING_HOSTILE_DIALECT_H_
#define TETHER_TESTING_HOSTILE_DIALECT_H_

#include <absl/status/status.h>
#include <absl/time/time.h>

#include <functional>
#include <string>
#include <vector>

namespace tether::testing {

// How long the worker may take to end a connection it cannot accept.
// (A backend may give strangers a few seconds to finish their handshake.)
inline constexpr absl::Duration kRefuseBound = absl::Seconds(10);

// Named bytes a stranger sends.
struct HostileBytes {
  std::string name;
  std::string bytes;
};

// What a backend's own protocol adds to the suite.
struct HostileDialect {
  // Openings of a connection in the backend's wire protocol, sent raw over
  // TCP, that announce a huge or negative length: each must be refused.
  // Their first half is also sent as a truncated frame.
  std::vector<HostileBytes> openings;

  // For a transport a raw client cannot get past (gRPC's HTTP/2): frames
  // of the backend's own framing that announce a huge or negative length
  // (their first halves are sent as truncated frames), and `deliver`, which
  // sends one frame on a connection of that transport to `address`
  // ("host:port") as a stranger claiming to be rank 0 ("agent0") would,
  // keeps the connection open and returns the status the worker ended it
  // with, or DEADLINE_EXCEEDED if it did not within `bound`.
  std::vector<HostileBytes> frames;
  std::function<absl::Status(const std::string& address,
                             const std::string& frame, absl::Duration bound)>
      deliver;
  // A well-formed request frame for `deliver`: when the group shares a
  // secret that the stranger does not have, it must be refused with
  // `refused_before_authentication`.
  std::string request;
  absl::StatusCode refused_before_authentication =
      absl::StatusCode::kUnauthenticated;
};

}  // namespace tether::testing

#endif  // TETHER_TESTING_HOSTILE_DIALECT_H_
