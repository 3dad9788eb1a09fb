#include "core/auth/handshake.h"

#include <absl/strings/str_cat.h>

#include <utility>

namespace tether::auth {
namespace {

Role other(Role role) {
  return role == Role::kClient ? Role::kServer : Role::kClient;
}

}  // namespace

Handshake::Handshake(const Authenticator& authenticator, Role role,
                     std::string self, std::optional<std::string> expected_peer,
                     HandshakeShape shape)
    : authenticator_(authenticator),
      role_(role),
      self_(std::move(self)),
      shape_(shape),
      own_challenge_(authenticator.challenge()),
      peer_(expected_peer.value_or("")),
      peer_known_(expected_peer.has_value()) {}

std::vector<HandshakeMessage> Handshake::start() {
  if (!shape_.speaks_first || hello_sent_) return {};
  return {hello()};
}

HandshakeMessage Handshake::hello() {
  hello_sent_ = true;
  return {HandshakeStep::kHello, self_, own_challenge_};
}

HandshakeMessage Handshake::proof() {
  proof_sent_ = true;
  return {HandshakeStep::kProof, self_,
          authenticator_.prove(role_, self_, peer_, peer_challenge_,
                               own_challenge_)};
}

absl::Status Handshake::fail(std::string why) {
  failed_ = absl::UnauthenticatedError(std::move(why));
  return failed_;
}

absl::StatusOr<std::vector<HandshakeMessage>> Handshake::on_message(
    const HandshakeMessage& message) {
  if (!failed_.ok()) return failed_;
  const std::string who = peer_known_ ? peer_ : message.name;
  if (peer_known_ && message.name != peer_) {
    return fail(absl::StrCat("the peer of worker '", self_,
                             "' on a stream with '", peer_, "' says it is '",
                             message.name, "'"));
  }
  std::vector<HandshakeMessage> out;
  if (message.step == HandshakeStep::kHello) {
    if (hello_received_) {
      return fail(absl::StrCat("worker '", who, "' sent a second challenge"));
    }
    if (message.data.size() != kChallengeBytes) {
      return fail(absl::StrCat("worker '", who, "' sent a challenge of ",
                               message.data.size(), " bytes (not ",
                               kChallengeBytes, ")"));
    }
    hello_received_ = true;
    peer_ = message.name;
    peer_known_ = true;
    peer_challenge_ = message.data;
    if (!hello_sent_) out.push_back(hello());
    if (!shape_.proves_after_verifying) out.push_back(proof());
    return out;
  }
  if (message.step != HandshakeStep::kProof) {
    return fail(absl::StrCat("worker '", who, "' sent an unknown step ",
                             static_cast<int>(message.step)));
  }
  if (!hello_received_ || !hello_sent_ || verified_) {
    return fail(absl::StrCat("worker '", who, "' sent a proof out of turn"));
  }
  if (!authenticator_.verify(message.data, other(role_), peer_, self_,
                             own_challenge_, peer_challenge_)) {
    return fail(absl::StrCat("worker '", who,
                             "' failed to authenticate (a different secret?)"));
  }
  verified_ = true;
  if (!proof_sent_) out.push_back(proof());
  return out;
}

}  // namespace tether::auth
