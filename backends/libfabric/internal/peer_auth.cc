#include "backends/libfabric/internal/agent_state.h"

#include <c10/util/Logging.h>

namespace tether::backends::libfabric::internal {

void State::send_auth(int rank, AuthFrame frame) {
  OutFrame out;
  out.header.kind = FrameKind::kAuth;
  out.tail = frame::write_auth(frame);
  enqueue(rank, std::move(out));
}

bool State::admitted(Peer& peer, const FrameHeader& header) {
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
  LOG(WARNING) << "libfabric agent of worker '" << self_.name
               << "' drops a frame (kind " << static_cast<int>(header.kind)
               << ") from " << describe(peer.rank)
               << ", which has not authenticated";
  if (frame::carries_message(header.kind) && header.arg0 != 0) {
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

void State::on_auth_frame(Peer& peer, absl::string_view tail) {
  absl::StatusOr<AuthFrame> frame = frame::read_auth(tail);
  if (!frame.ok()) {
    LOG(WARNING) << "libfabric agent of worker '" << self_.name
                 << "' drops an authentication frame from "
                 << describe(peer.rank) << ": " << frame.status().message();
    return;
  }
  const std::string& name = peer.name;
  switch (frame->step) {
    // ---- we serve its requests
    case AuthStep::kHello:
      if (!auth_) {
        refuse(peer, absl::StrCat("worker '", self_.name,
                                  "' does not authenticate peers (it has no "
                                  "secret); the group must agree on one"));
        return;
      }
      if (frame->name != name) {
        refuse(peer, absl::StrCat("rank ", peer.rank, " is worker '", name,
                                  "', not '", frame->name, "'"));
        return;
      }
      peer.server_auth = Peer::ServerAuth::kAwaitProof;
      peer.server_challenge = auth_->challenge();
      peer.hello_challenge = frame->challenge;
      send_auth(peer.rank,
                AuthFrame{AuthStep::kServerProof, self_.name,
                          peer.server_challenge,
                          auth_->prove(auth::Role::kServer, self_.name, name,
                                       frame->challenge,
                                       peer.server_challenge)});
      return;
    case AuthStep::kClientProof:
      if (!auth_ || peer.server_auth != Peer::ServerAuth::kAwaitProof) {
        refuse(peer, "an unexpected authentication step");
        return;
      }
      if (!auth_->verify(frame->proof, auth::Role::kClient, name, self_.name,
                         peer.server_challenge, peer.hello_challenge)) {
        refuse(peer, "authentication failed (a different secret?)");
        return;
      }
      peer.server_auth = Peer::ServerAuth::kAuthenticated;
      send_auth(peer.rank, AuthFrame{AuthStep::kAccepted, self_.name, "", ""});
      return;
    // ---- it serves our requests
    case AuthStep::kServerProof:
      if (!auth_ || peer.client_auth != Peer::ClientAuth::kHelloSent) break;
      if (frame->name != name ||
          !auth_->verify(frame->proof, auth::Role::kServer, name, self_.name,
                         peer.client_challenge, frame->challenge)) {
        fail_client_auth(
            peer, absl::UnauthenticatedError(absl::StrCat(
                      "worker '", name,
                      "' failed to authenticate (a different secret?)")));
        return;
      }
      peer.client_auth = Peer::ClientAuth::kProofSent;
      send_auth(peer.rank,
                AuthFrame{AuthStep::kClientProof, self_.name, "",
                          auth_->prove(auth::Role::kClient, self_.name, name,
                                       frame->challenge,
                                       peer.client_challenge)});
      return;
    case AuthStep::kAccepted: {
      if (!auth_ || peer.client_auth != Peer::ClientAuth::kProofSent) break;
      peer.client_auth = Peer::ClientAuth::kReady;
      std::deque<std::pair<int64_t, Message>> waiting;
      waiting.swap(peer.auth_waiting);
      for (auto& [id, request] : waiting) {
        if (!pending_.contains(id)) {  // timed out meanwhile
          peer.requests.erase(id);
          continue;
        }
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
  LOG(WARNING) << "libfabric agent of worker '" << self_.name
               << "' drops an out-of-turn authentication frame (step "
               << static_cast<int>(frame->step) << ") from "
               << describe(peer.rank);
}

void State::refuse(Peer& peer, const std::string& why) {
  LOG(WARNING) << "libfabric agent of worker '" << self_.name << "' refused "
               << describe(peer.rank) << ": " << why;
  peer.server_auth = Peer::ServerAuth::kNone;
  send_auth(peer.rank, AuthFrame{AuthStep::kRefused, self_.name, "", why});
}

void State::fail_client_auth(Peer& peer, const absl::Status& status) {
  LOG(WARNING) << "libfabric agent of worker '" << self_.name
               << "' fails its requests to " << describe(peer.rank) << ": "
               << status.message();
  peer.client_auth = Peer::ClientAuth::kNone;
  peer.auth_waiting.clear();
  std::vector<int64_t> ids(peer.requests.begin(), peer.requests.end());
  peer.requests.clear();
  for (int64_t id : ids) pending_.complete(id, status);
}

}  // namespace tether::backends::libfabric::internal
