// Handshake: the challenge-response between two workers (auth.h) as one
// transport-free state machine. Messages in, messages out, a verdict: a
// backend feeds it what the peer sent and sends what it returns, inside
// its own envelope (gRPC's auth frames, TensorPipe tcp's handshake frames,
// libfabric's control frames); the machine never touches a socket, a
// thread or a clock (the backend bounds the time).
//
// The exchange: each side sends a Hello (its name and a fresh challenge)
// and, on the peer's Hello, a Proof (its answer to the peer's challenge,
// bound to both names and roles and to its own challenge); a side is
// verified when the peer's Proof checks out. The Shape says who speaks
// when, which is how the backends' exchanges differ:
//
//   both speak first, prove on hello     (gRPC, 2 steps: H|H, P|P)
//   responder answers hello with H + P   (TensorPipe tcp, 3 steps:
//                                         c:H, s:H+P, c:P)
//   responder proves after verifying     (libfabric, 4 steps:
//                                         c:H, s:H, c:P, s:P)
//
// Thread safety: none; one per connection, used by one thread at a time
// (or under the connection's lock).
#ifndef TETHER_CORE_AUTH_HANDSHAKE_H_
#define TETHER_CORE_AUTH_HANDSHAKE_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/auth/auth.h"

namespace tether::auth {

enum class HandshakeStep : uint8_t { kHello = 1, kProof = 2 };

struct HandshakeMessage {
  HandshakeStep step = HandshakeStep::kHello;
  std::string name;  // the sender's worker name
  std::string data;  // Hello: a challenge; Proof: the proof
};

// Who speaks when (see the header comment).
struct HandshakeShape {
  // Sends its Hello from start(); else only in answer to the peer's.
  bool speaks_first = true;
  // Sends its Proof only once the peer's Proof has checked out (the
  // responder of a 4-step exchange); else on the peer's Hello.
  bool proves_after_verifying = false;

  static HandshakeShape symmetric() { return {true, false}; }
  static HandshakeShape initiator() { return {true, false}; }
  static HandshakeShape responder_three_step() { return {false, false}; }
  static HandshakeShape responder_four_step() { return {false, true}; }
};

class Handshake {
 public:
  // `self` plays `role` (the side that opened the connection is the
  // client). `expected_peer`: the name the peer must give (a client knows
  // whom it dialled), or nullopt to learn it from its Hello (a server).
  Handshake(const Authenticator& authenticator, Role role, std::string self,
            std::optional<std::string> expected_peer,
            HandshakeShape shape = HandshakeShape::symmetric());

  // What to send when the connection is up (empty if this side waits).
  [[nodiscard]] std::vector<HandshakeMessage> start();

  // The peer's next message: what to send in answer (maybe nothing), or
  // UNAUTHENTICATED naming the peer and what was wrong (a wrong name, a
  // step out of turn, a proof that fails). After an error the connection
  // is to be refused; the machine refuses everything.
  [[nodiscard]] absl::StatusOr<std::vector<HandshakeMessage>> on_message(
      const HandshakeMessage& message);

  // The peer has proven it knows the secret.
  bool verified() const { return verified_; }
  // Both ways done: the peer is verified and this side has sent its proof.
  bool done() const { return verified_ && proof_sent_; }
  // The peer's name: the expected one, or the one its Hello gave.
  const std::string& peer() const { return peer_; }

 private:
  HandshakeMessage hello();
  HandshakeMessage proof();
  absl::Status fail(std::string why);

  const Authenticator& authenticator_;
  const Role role_;
  const std::string self_;
  const HandshakeShape shape_;
  const std::string own_challenge_;
  std::string peer_;
  bool peer_known_;
  std::string peer_challenge_;
  bool hello_sent_ = false;
  bool hello_received_ = false;
  bool proof_sent_ = false;
  bool verified_ = false;
  absl::Status failed_;
};

}  // namespace tether::auth

#endif  // TETHER_CORE_AUTH_HANDSHAKE_H_
