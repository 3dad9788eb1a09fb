// The handshake steps of a connection (tcp_transport_connection.h; the
// frames are tcp_handshake.h's).
#include <absl/strings/str_cat.h>
#include <absl/time/time.h>
#include <c10/util/Logging.h>
#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <string>

#include "backends/tensorpipe/internal/tcp_transport_connection.h"
#include "backends/tensorpipe/internal/tcp_transport_listener.h"

namespace tether::backends::tensorpipe::internal::tcp {

void ConnectionImpl::start_client_handshake() {
  state_ = State::kHandshake;
  step_ = Step::kAwaitHello;
  const TcpTransportOptions& options = context_->options();
  HandshakeFrame hello = own_hello();
  if (options.auth) {
    handshake_.emplace(*options.auth, auth::Role::kClient, options.self,
                       std::nullopt, auth::HandshakeShape::initiator());
    for (const auth::HandshakeMessage& message : handshake_->start()) {
      hello.challenge = message.data;  // the one Hello
    }
  }
  send_frame(hello);
}

HandshakeFrame ConnectionImpl::own_hello() const {
  const TcpTransportOptions& options = context_->options();
  HandshakeFrame hello;
  hello.kind = HandshakeKind::kHello;
  hello.has_secret = options.auth.has_value();
  hello.name = options.self;
  return hello;
}

void ConnectionImpl::send_frame(const HandshakeFrame& frame) {
  handshake_out_ += encode_handshake_frame(frame);
  process_writes();
}

void ConnectionImpl::on_handshake_input() {
  while (!error_ &&
         (state_ == State::kHandshake || state_ == State::kRefusing)) {
    if (state_ == State::kRefusing) {
      // Waiting for the refused peer to close; what it sends is dropped.
      consume(buffered().size());
      const Fill result = fill(4096);
      if (result == Fill::kClosed) {
        // Its close (or reset) ends the refusal: report ours.
        setError(refused_error(refusal_));
        return;
      }
      if (result == Fill::kAgain) return;
      continue;
    }
    absl::StatusOr<std::optional<ParsedHandshakeFrame>> parsed =
        parse_handshake_frame(buffered());
    if (!parsed.ok()) {
      fail(tcp_error(std::string(parsed.status().message())),
           std::string(parsed.status().message()), /*log=*/true);
      return;
    }
    if (!parsed->has_value()) {
      // Never more than one frame's worth buffered.
      const size_t room = kMaxHandshakeFrameBytes + 4 - buffered().size();
      const size_t before = buffered().size();
      const Fill result = fill(room);
      if (result == Fill::kAgain) return;
      if (result == Fill::kClosed) {
        // A peer that goes away in the handshake: a port scan, a peer that
        // gave up, or one that refused us without saying why.
        fail(fill_error_,
             before == 0 ? "closed before the handshake ended"
                         : "closed in the middle of a handshake frame",
             /*log=*/!server_ || before > 0);
        return;
      }
      continue;
    }
    const size_t consumed = (*parsed)->consumed;
    const HandshakeFrame frame = std::move((*parsed)->frame);
    consume(consumed);
    on_frame(frame);
  }
  if (!error_ && state_ == State::kEstablished) {
    process_writes();
    process_reads(/*readable=*/true);
  }
}

std::string ConnectionImpl::refusal_text(const absl::Status& status) const {
  return absl::StrCat("worker '", context_->options().self,
                      "': ", status.message());
}

std::string ConnectionImpl::check_member(const std::string& name) const {
  const TcpTransportOptions& options = context_->options();
  if (name.empty()) return "a handshake without a worker name";
  if (options.members.empty() ||
      std::find(options.members.begin(), options.members.end(), name) !=
          options.members.end()) {
    return "";
  }
  return absl::StrCat("worker '", options.self, "': '", name,
                      "' is not a worker of this group");
}

void ConnectionImpl::on_frame(const HandshakeFrame& frame) {
  if (frame.version != kHandshakeVersion) {
    const std::string reason = absl::StrCat(
        "worker '", context_->options().self, "' speaks handshake version ",
        kHandshakeVersion, ", the peer ", frame.version);
    if (server_) {
      refuse(reason);
    } else {
      fail(refused_error(reason), reason, /*log=*/true);
    }
    return;
  }
  if (server_) {
    on_server_frame(frame);
  } else {
    on_client_frame(frame);
  }
}

void ConnectionImpl::on_server_frame(const HandshakeFrame& frame) {
  const TcpTransportOptions& options = context_->options();
  if (frame.kind == HandshakeKind::kVerdict && !frame.accepted) {
    fail(refused_error(frame.reason),
         absl::StrCat("the peer refused us: ", frame.reason), /*log=*/true);
    return;
  }
  if (step_ == Step::kAwaitHello && frame.kind == HandshakeKind::kHello) {
    peer_name_ = frame.name;
    if (std::string why = check_member(frame.name); !why.empty()) {
      refuse(why);
      return;
    }
    if (options.auth && !frame.has_secret) {
      refuse(absl::StrCat("worker '", options.self,
                          "' requires authentication and worker '", frame.name,
                          "' has no secret; the group must agree on one"));
      return;
    }
    if (!options.auth && frame.has_secret) {
      refuse(absl::StrCat("worker '", options.self,
                          "' does not authenticate peers (it has no secret); "
                          "the group must agree on one"));
      return;
    }
    HandshakeFrame hello = own_hello();
    if (options.auth) {
      handshake_.emplace(*options.auth, auth::Role::kServer, options.self,
                         std::nullopt,
                         auth::HandshakeShape::responder_three_step());
      absl::StatusOr<std::vector<auth::HandshakeMessage>> answer =
          handshake_->on_message(
              {auth::HandshakeStep::kHello, frame.name, frame.challenge});
      if (!answer.ok()) {
        refuse(refusal_text(answer.status()));
        return;
      }
      // Our Hello and Proof, in one frame.
      for (const auth::HandshakeMessage& message : *answer) {
        (message.step == auth::HandshakeStep::kHello ? hello.challenge
                                                     : hello.proof) =
            message.data;
      }
    }
    step_ = Step::kAwaitProof;
    send_frame(hello);
    return;
  }
  if (step_ == Step::kAwaitProof && frame.kind == HandshakeKind::kProof) {
    if (handshake_) {
      absl::Status verified =
          handshake_
              ->on_message({auth::HandshakeStep::kProof, peer_name_,
                            frame.proof})
              .status();
      if (!verified.ok()) {
        refuse(refusal_text(verified));
        return;
      }
    }
    HandshakeFrame verdict;
    verdict.kind = HandshakeKind::kVerdict;
    verdict.accepted = true;
    send_frame(verdict);
    established();
    return;
  }
  fail(tcp_error("an unexpected handshake frame"),
       "an unexpected handshake frame", /*log=*/true);
}

void ConnectionImpl::on_client_frame(const HandshakeFrame& frame) {
  const TcpTransportOptions& options = context_->options();
  if (frame.kind == HandshakeKind::kVerdict && !frame.accepted) {
    fail(refused_error(frame.reason), frame.reason, /*log=*/false);
    return;
  }
  if (step_ == Step::kAwaitHello && frame.kind == HandshakeKind::kHello) {
    peer_name_ = frame.name;
    std::string why = check_member(frame.name);
    if (why.empty() && frame.has_secret != options.auth.has_value()) {
      why = absl::StrCat("worker '", frame.name, "' and worker '", options.self,
                         "' disagree on having a secret");
    }
    HandshakeFrame proof;
    proof.kind = HandshakeKind::kProof;
    if (why.empty() && handshake_) {
      // The server's Hello carries its Proof: both go through the machine,
      // and our Proof goes out only if theirs checks out.
      absl::StatusOr<std::vector<auth::HandshakeMessage>> answer =
          handshake_->on_message(
              {auth::HandshakeStep::kHello, frame.name, frame.challenge});
      if (answer.ok()) {
        for (const auth::HandshakeMessage& message : *answer) {
          proof.proof = message.data;  // our Proof
        }
        absl::Status verified =
            handshake_
                ->on_message({auth::HandshakeStep::kProof, frame.name,
                              frame.proof})
                .status();
        if (!verified.ok()) answer = verified;
      }
      if (!answer.ok()) why = refusal_text(answer.status());
    }
    if (!why.empty()) {
      HandshakeFrame verdict;
      verdict.kind = HandshakeKind::kVerdict;
      verdict.reason = why;
      send_frame(verdict);
      fail(refused_error(why), why, /*log=*/true);
      return;
    }
    step_ = Step::kAwaitVerdict;
    send_frame(proof);
    return;
  }
  if (step_ == Step::kAwaitVerdict && frame.kind == HandshakeKind::kVerdict) {
    established();
    return;
  }
  fail(tcp_error("an unexpected handshake frame"),
       "an unexpected handshake frame", /*log=*/true);
}

void ConnectionImpl::refuse(const std::string& reason) {
  int suppressed = 0;
  if (context_->may_log(&suppressed)) {
    LOG(WARNING) << context_->options().log_prefix
                 << " refused a connection from " << describe_peer() << ": "
                 << reason
                 << (suppressed > 0
                         ? absl::StrCat(" (", suppressed, " more not logged)")
                         : "");
  }
  HandshakeFrame verdict;
  verdict.kind = HandshakeKind::kVerdict;
  verdict.reason = reason;
  refusal_ = reason;
  state_ = State::kRefusing;
  send_frame(verdict);
  if (error_) return;
  // The verdict is small and the socket's buffer empty: it is out unless
  // the peer is gone. Then wait for the peer's close, so the verdict is not
  // lost to a reset.
  if (handshake_sent_ < handshake_out_.size()) {
    setError(refused_error(reason));
    return;
  }
  ::shutdown(fd_, SHUT_WR);
}

void ConnectionImpl::fail(tp::Error error, const std::string& why, bool log) {
  int suppressed = 0;
  if (log && context_->may_log(&suppressed)) {
    LOG(WARNING) << context_->options().log_prefix << " closed a connection "
                 << (server_ ? "from " : "to ") << describe_peer() << ": "
                 << why
                 << (suppressed > 0
                         ? absl::StrCat(" (", suppressed, " more not logged)")
                         : "");
  }
  setError(std::move(error));
}

void ConnectionImpl::established() {
  state_ = State::kEstablished;
  if (server_) notify_listener(true);
}

void ConnectionImpl::on_handshake_timeout() {
  if (error_ || state_ == State::kEstablished) return;
  if (state_ == State::kRefusing) {
    setError(refused_error(refusal_));
    return;
  }
  const std::string why =
      absl::StrCat("no handshake within ",
                   absl::FormatDuration(handshake_bound()));
  fail(tcp_error(why), why, /*log=*/true);
}

void ConnectionImpl::notify_listener(bool ok) {
  if (!server_ || listener_notified_) return;
  listener_notified_ = true;
  // Deferred: the listener may be inside createAndInitConnection() for us.
  context_->deferToLoop([listener = listener_, key = key_, ok] {
    if (std::shared_ptr<ListenerImpl> alive = listener.lock()) {
      alive->handshake_done(key, ok);
    }
  });
}

}  // namespace tether::backends::tensorpipe::internal::tcp
