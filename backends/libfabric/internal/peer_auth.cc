#include "backends/libfabric/internal/agent_state.h"

#include <c10/util/Logging.h>

namespace tether::backends::libfabric::internal {

void AgentState::send_auth(int rank, AuthFrame frame) {
  OutFrame out;
  out.header.kind = FrameKind::kAuth;
  out.tail = framing::write_auth(frame);
  enqueue(rank, std::move(out));
}

void AgentState::send_handshake(
    Peer& peer, auth::Role role,
    const std::vector<auth::HandshakeMessage>& messages) {
  const bool client = role == auth::Role::kClient;
  for (const auth::HandshakeMessage& message : messages) {
    AuthFrame frame;
    frame.name = message.name;
    if (message.step == auth::HandshakeStep::kHello) {
      frame.step = client ? AuthStep::kClientHello : AuthStep::kServerHello;
      frame.challenge = message.data;
    } else {
      frame.step = client ? AuthStep::kClientProof : AuthStep::kServerProof;
      frame.proof = message.data;
    }
    send_auth(peer.rank, std::move(frame));
  }
}

void AgentState::start_client_auth(Peer& peer) {
  peer.client_handshake = std::make_unique<auth::Handshake>(
      *auth_, auth::Role::kClient, self_.name, peer.name,
      auth::HandshakeShape::initiator());
  peer.client_auth = Peer::ClientAuth::kStarted;
  send_handshake(peer, auth::Role::kClient, peer.client_handshake->start());
}

bool AgentState::admitted(Peer& peer, const FrameHeader& header) {
  if (!auth_) return true;
  const bool client_ready = peer.client_auth == Peer::ClientAuth::kReady;
  const bool server_ready =
      peer.server_auth == Peer::ServerAuth::kAuthenticated;
  switch (header.kind) {
    case FrameKind::kAuth:
    case FrameKind::kKeepalive:
    case FrameKind::kKeepaliveAck:
    case FrameKind::kCredit:
      // The handshake itself, and what keeps frames and liveness going
      // (their only effect is in the header, on our own flow control).
      return true;
    case FrameKind::kRequest:
      if (server_ready) return true;
      break;
    case FrameKind::kResponse:
    case FrameKind::kError:
      if (client_ready) return true;
      break;
    case FrameKind::kRelease:
    case FrameKind::kClearToSend:
    case FrameKind::kGoodbye:
      if (client_ready || server_ready) return true;
      break;
  }
  LOG(WARNING) << who() << " drops a frame (kind "
               << static_cast<int>(header.kind) << ") from "
               << describe(peer.rank) << ", which has not authenticated";
  if (framing::carries_message(header.kind) && header.arg0 != 0) {
    // Its buffers are not pulled: let it release them.
    send_control(peer.rank, FrameKind::kRelease, header.arg0);
  }
  if (header.kind == FrameKind::kRequest) {
    refuse(peer, absl::StrCat("worker '", self_.name,
                              "' requires authentication and the peer sent a "
                              "request without it"));
  }
  return false;
}

void AgentState::on_auth_frame(Peer& peer, absl::string_view tail) {
  absl::StatusOr<AuthFrame> frame = framing::read_auth(tail);
  if (!frame.ok()) {
    LOG(WARNING) << who() << " drops an authentication frame from "
                 << describe(peer.rank) << ": " << frame.status().message();
    return;
  }
  const std::string& name = peer.name;
  const bool hello = frame->step == AuthStep::kClientHello ||
                     frame->step == AuthStep::kServerHello;
  const auth::HandshakeMessage message{
      hello ? auth::HandshakeStep::kHello : auth::HandshakeStep::kProof,
      frame->name, hello ? frame->challenge : frame->proof};
  switch (frame->step) {
    // ---- we serve its requests
    case AuthStep::kClientHello: {
      if (!auth_) {
        refuse(peer, absl::StrCat("worker '", self_.name,
                                  "' does not authenticate peers (it has no "
                                  "secret); the group must agree on one"));
        return;
      }
      // A Hello starts anew (the peer may have lost us and come back).
      peer.server_handshake = std::make_unique<auth::Handshake>(
          *auth_, auth::Role::kServer, self_.name, name,
          auth::HandshakeShape::responder_four_step());
      peer.server_auth = Peer::ServerAuth::kStarted;
      absl::StatusOr<std::vector<auth::HandshakeMessage>> out =
          peer.server_handshake->on_message(message);
      if (!out.ok()) {
        refuse(peer, std::string(out.status().message()));
        return;
      }
      send_handshake(peer, auth::Role::kServer, *out);
      return;
    }
    case AuthStep::kClientProof: {
      if (!auth_ || peer.server_auth != Peer::ServerAuth::kStarted) {
        refuse(peer, "an unexpected authentication step");
        return;
      }
      absl::StatusOr<std::vector<auth::HandshakeMessage>> out =
          peer.server_handshake->on_message(message);
      if (!out.ok()) {
        refuse(peer, std::string(out.status().message()));
        return;
      }
      if (peer.server_handshake->verified()) {
        peer.server_auth = Peer::ServerAuth::kAuthenticated;
      }
      send_handshake(peer, auth::Role::kServer, *out);
      return;
    }
    // ---- it serves our requests
    case AuthStep::kServerHello:
    case AuthStep::kServerProof: {
      if (!auth_ || peer.client_auth != Peer::ClientAuth::kStarted) break;
      absl::StatusOr<std::vector<auth::HandshakeMessage>> out =
          peer.client_handshake->on_message(message);
      if (!out.ok()) {
        fail_client_auth(peer, out.status());
        return;
      }
      send_handshake(peer, auth::Role::kClient, *out);
      if (!peer.client_handshake->done()) return;
      peer.client_auth = Peer::ClientAuth::kReady;
      std::deque<std::pair<int64_t, Message>> waiting;
      waiting.swap(peer.auth_waiting);
      for (auto& [id, request] : waiting) {
        // Sent even if it has timed out meanwhile (start_request); its
        // response is then let go unread.
        if (!pending_.contains(id)) peer.requests.erase(id);
        send_message(peer.rank, FrameKind::kRequest, id, 0,
                     std::move(request));
      }
      return;
    }
    case AuthStep::kRefused:
      if (peer.requests.empty() && peer.auth_waiting.empty() &&
          peer.client_auth == Peer::ClientAuth::kNone) {
        break;  // nothing of ours it could be about
      }
      if (!auth_) {
        fail_client_auth(
            peer, absl::UnauthenticatedError(absl::StrCat(
                      "worker '", name, "' requires authentication and worker '",
                      self_.name, "' has no secret (RpcOptions::auth_secret or ",
                      auth::kSecretEnv, "): ", frame->proof)));
      } else {
        fail_client_auth(peer, absl::UnauthenticatedError(absl::StrCat(
                                   "worker '", name, "' refused worker '",
                                   self_.name, "': ", frame->proof)));
      }
      return;
  }
  LOG(WARNING) << who() << " drops an out-of-turn authentication frame (step "
               << static_cast<int>(frame->step) << ") from "
               << describe(peer.rank);
}

void AgentState::refuse(Peer& peer, const std::string& why) {
  LOG(WARNING) << who() << " refused " << describe(peer.rank) << ": " << why;
  peer.server_auth = Peer::ServerAuth::kNone;
  peer.server_handshake.reset();
  send_auth(peer.rank, AuthFrame{AuthStep::kRefused, self_.name, "", why});
}

void AgentState::fail_client_auth(Peer& peer, const absl::Status& status) {
  LOG(WARNING) << who() << " fails its requests to " << describe(peer.rank)
               << ": " << status.message();
  peer.client_auth = Peer::ClientAuth::kNone;
  peer.client_handshake.reset();
  peer.auth_waiting.clear();
  std::vector<int64_t> ids(peer.requests.begin(), peer.requests.end());
  peer.requests.clear();
  for (int64_t id : ids) pending_.complete(id, status);
}

}  // namespace tether::backends::libfabric::internal
