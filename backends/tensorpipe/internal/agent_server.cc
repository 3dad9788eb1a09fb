// The server side of the tensorpipe agent: its listener (replaced when it
// fails), requests in on the pipes peers open (authenticated when a secret
// is set) and on ours, responses out; responses to our own requests on a
// peer's pipe go to the client side.
#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <c10/util/Logging.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "backends/tensorpipe/internal/agent_state.h"
#include "backends/tensorpipe/internal/tcp_transport.h"
#include "core/auth/auth.h"

namespace tether::backends::tensorpipe::internal {
namespace {

// How long a failed listener is given to free its addresses.
constexpr int kListenAgainAttempts = 100;
constexpr absl::Duration kListenAgainPause = absl::Milliseconds(20);

}  // namespace

// ------------------------------------------------------------- server side

void AgentState::accept_next(std::shared_ptr<::tensorpipe::Listener> listener) {
  ::tensorpipe::Listener& target = *listener;
  target.accept([weak = weak_from_this(), listener = std::move(listener)](
                    const ::tensorpipe::Error& error,
                    std::shared_ptr<::tensorpipe::Pipe> pipe) {
    on_callback(weak,
                [listener, error, pipe = std::move(pipe)](AgentState& state) {
                  state.on_accept(listener, error, pipe);
                });
  });
}

void AgentState::on_accept(
    const std::shared_ptr<::tensorpipe::Listener>& listener,
    const ::tensorpipe::Error& error,
    std::shared_ptr<::tensorpipe::Pipe> pipe) {
  std::shared_ptr<OutgoingFrame> hello;
  {
    absl::MutexLock lock(&mu_);
    if (closed_ || listener != listener_) {
      if (pipe != nullptr) pipe->close();
      return;
    }
    if (!error) server_pipes_.insert(pipe);
    if (!error && auth_) {
      auto handshake = std::make_unique<auth::Handshake>(
          *auth_, auth::Role::kServer, self_.name, std::nullopt,
          auth::HandshakeShape::symmetric());
      for (const auth::HandshakeMessage& message : handshake->start()) {
        hello = auth_frame(message);  // the one Hello
      }
      server_auth_[pipe.get()] = std::move(handshake);
    }
  }
  if (hello != nullptr) {
    pipe->write(hello->to_tensorpipe(),
                [hello](const ::tensorpipe::Error& /*error*/) {});
  }
  if (error) {
    // tensorpipe fails the whole listener when one incoming connection dies
    // before its first packet (a peer that crashed or shut down while
    // connecting). Peers know our addresses: listen on them again.
    LOG(WARNING) << who()
                 << ": the listener failed (" << error.what()
                 << "); listening again";
    post_io([](AgentState& state) { state.listen_again(0); });
    return;
  }
  accept_next(listener);
  if (!auth_) {
    // Our requests may go on it once its first frame has come (see
    // opening_).
    absl::MutexLock lock(&mu_);
    if (!closed_ && server_pipes_.contains(pipe)) opening_.insert(pipe.get());
  }
  read_requests(std::move(pipe));
}

void AgentState::on_pipe_from(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                              const std::string& name) {
  // A dynamic group's joiner may not be known yet: then its pipe only
  // serves its requests.
  std::optional<common::Peer> peer = peers_.by_name(name);
  if (!peer.has_value()) return;
  const int rank = peer->info.id;
  std::shared_ptr<ClientPipe> retired;
  {
    absl::MutexLock lock(&mu_);
    if (closed_ || !server_pipes_.contains(pipe)) return;
    accepted_from_[rank] = pipe;
    retired = retire_for_accepted_locked(rank);
  }
  if (retired != nullptr) retired->pipe->close();
}

std::shared_ptr<AgentState::ClientPipe> AgentState::retire_for_accepted_locked(
    int rank) {
  // Both opened a pipe at once: the lower rank's carries both ways. Ours
  // goes once its requests are answered, unless the peer sends on it; one
  // still authenticating waits until it is ready (on_client_auth).
  auto accepted = accepted_from_.find(rank);
  auto it = client_pipes_.find(rank);
  if (rank >= self_.id || accepted == accepted_from_.end() ||
      it == client_pipes_.end() || it->second->adopted ||
      !it->second->ready || !it->second->queued.empty() ||
      it->second->serves_peer) {
    return nullptr;
  }
  std::shared_ptr<ClientPipe> retired = it->second;
  retired->retiring = true;
  adopt_locked(rank, accepted->second);
  // Closed when its last request is answered; closing one that has not
  // heard from the peer yet could fail the peer's listener (see
  // write_request), so a pipe whose only request timed out before it left
  // stays open (rare: a race and a timeout together).
  if (retired->outstanding > 0 || !retired->heard) return nullptr;
  return retired;
}

void AgentState::listen_again(int attempt) {
  std::shared_ptr<::tensorpipe::Context> context;
  std::shared_ptr<::tensorpipe::Listener> old;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    context = context_;
    old = listener_;
  }
  old->close();
  for (const std::string& url : listening_urls_) {
    absl::Status usable = check_can_listen(url);
    if (usable.ok()) continue;
    // The old listener frees its sockets on tensorpipe's threads, soon.
    if (attempt < kListenAgainAttempts) {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      timers_->schedule(absl::Now() + kListenAgainPause,
                        [weak = weak_from_this(), attempt] {
                          std::shared_ptr<AgentState> state = weak.lock();
                          if (state == nullptr) return;
                          state->post_io([attempt](AgentState& state) {
                            state.listen_again(attempt + 1);
                          });
                        });
      return;
    }
    LOG(ERROR) << who()
               << " no longer accepts connections: " << usable.message();
    return;
  }
  std::shared_ptr<::tensorpipe::Listener> listener;
  try {
    listener = context->listen(listening_urls_);
  } catch (const std::exception& e) {
    LOG(ERROR) << who()
               << " cannot listen again on "
               << absl::StrJoin(listening_urls_, ", ") << ": " << e.what()
               << "; it no longer accepts connections";
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      listener->close();
      return;
    }
    listener_ = listener;
  }
  accept_next(std::move(listener));
}

void AgentState::read_requests(std::shared_ptr<::tensorpipe::Pipe> pipe) {
  ::tensorpipe::Pipe& target = *pipe;
  target.readDescriptor([weak = weak_from_this(), pipe = std::move(pipe)](
                            const ::tensorpipe::Error& error,
                            ::tensorpipe::Descriptor descriptor) {
    on_callback(weak, [pipe, error,
                       descriptor = std::move(descriptor)](AgentState& state) {
      state.on_request_descriptor(pipe, error, descriptor);
    });
  });
}

void AgentState::on_request_descriptor(
    const std::shared_ptr<::tensorpipe::Pipe>& pipe,
    const ::tensorpipe::Error& error,
    const ::tensorpipe::Descriptor& descriptor) {
  if (error) {
    // The peer went away or closed the pipe; its pending requests fail there.
    drop_server_pipe(pipe);
    return;
  }
  bool opened = false;
  {
    absl::MutexLock lock(&mu_);
    opened = opening_.erase(pipe.get()) > 0;
  }
  if (opened) on_pipe_from(pipe, pipe->getRemoteName());
  absl::StatusOr<std::shared_ptr<IncomingFrame>> allocated =
      internal::allocate_frame(descriptor, limits_);
  if (allocated.ok() && (*allocated)->header.kind == FrameKind::kBindAck) {
    allocated = absl::InvalidArgumentError("a bind answer on a server pipe");
  } else if (allocated.ok() &&
             (*allocated)->header.kind != FrameKind::kRequest &&
             (*allocated)->header.kind != FrameKind::kAuth &&
             (*allocated)->header.kind != FrameKind::kBind) {
    absl::MutexLock lock(&mu_);
    // Responses only where our requests went (on_pipe_from).
    if (!adopted_.contains(pipe.get())) {
      allocated = absl::InvalidArgumentError("a response on a server pipe");
    }
  }
  if (!allocated.ok()) {
    // Broken or beyond any limit: the pipe is unusable from here on. (A
    // message merely over this worker's limits is refused alone, below.)
    LOG(WARNING) << who()
                 << " drops a connection from '" << pipe->getRemoteName()
                 << "': " << allocated.status().ToString();
    drop_server_pipe(pipe);
    return;
  }
  std::shared_ptr<IncomingFrame> frame = *std::move(allocated);
  pipe->read(frame->allocation, [weak = weak_from_this(), pipe,
                                 frame](const ::tensorpipe::Error& error) {
    if (error) frame->quarantine();
    on_callback(weak, [pipe, frame, error](AgentState& state) {
      if (error) {
        state.drop_server_pipe(pipe, error.what());
        return;
      }
      if (!state.on_server_auth(pipe, *frame)) return;
      if (frame->header.kind == FrameKind::kAuth) {
        state.read_requests(pipe);  // the handshake goes on
        return;
      }
      state.read_requests(pipe);
      if (frame->header.kind == FrameKind::kRequest) {
        state.serve_request(ReplyRoute{pipe, {}}, *frame);
        return;
      }
      if (frame->header.kind == FrameKind::kBind) {
        state.on_bind(pipe, *frame);
        return;
      }
      std::shared_ptr<ClientPipe> client;
      {
        absl::MutexLock lock(&state.mu_);
        auto it = state.adopted_.find(pipe.get());
        if (it != state.adopted_.end()) client = it->second;
      }
      // (Gone meanwhile: its requests have failed already.)
      if (client != nullptr) state.deliver_response(client, *frame);
    });
  });
}

void AgentState::serve_request(const ReplyRoute& route, IncomingFrame& frame) {
  if (!frame.refused.ok()) {
    // Over this worker's limits: its bytes were read and dropped; the
    // sender learns why, and the pipe serves on.
    std::shared_ptr<OutgoingFrame> answer = internal::make_response_frame(
        frame.header.id,
        absl::Status(frame.refused.code(),
                     absl::StrCat("worker '", self_.name, "' refuses a ",
                                  message_type_name(frame.header.type), ": ",
                                  frame.refused.message())));
    if (std::shared_ptr<tcp::ConnectionImpl> express = route.express.lock()) {
      write_express(express, answer->to_tensorpipe().metadata);
    } else if (std::shared_ptr<::tensorpipe::Pipe> pipe = route.pipe.lock()) {
      pipe->write(answer->to_tensorpipe(),
                  [answer](const ::tensorpipe::Error& /*error*/) {});
    }
    return;
  }
  absl::StatusOr<Message> request = frame.take_result();
  incoming_.arrived(route, *std::move(request));
}

void AgentState::on_bind(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                         const IncomingFrame& frame) {
  const uint64_t nonce = frame.take_nonce();
  bool bound = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = express_binds_.find(nonce);
    if (it != express_binds_.end()) {
      std::shared_ptr<tcp::ConnectionImpl> connection =
          it->second.connection.lock();
      // The connection's peer (as its handshake named it) opened the pipe.
      if (connection != nullptr && server_pipes_.contains(pipe) &&
          it->second.peer == pipe->getRemoteName()) {
        express_links_[connection.get()] = ExpressLink{connection, pipe};
        bound = true;
      }
      express_binds_.erase(it);
    }
  }
  std::shared_ptr<OutgoingFrame> answer =
      make_bind_frame(FrameKind::kBindAck, bound ? nonce : 0);
  pipe->write(answer->to_tensorpipe(),
              [answer](const ::tensorpipe::Error& /*error*/) {});
}

void AgentState::on_express(
    const std::shared_ptr<tcp::ConnectionImpl>& connection,
    absl::string_view bytes) {
  absl::StatusOr<std::shared_ptr<IncomingFrame>> parsed =
      allocate_express_frame(bytes, limits_);
  if (!parsed.ok()) {
    fail_express(connection, std::string(parsed.status().message()));
    return;
  }
  std::shared_ptr<IncomingFrame> frame = *std::move(parsed);
  std::string refusal;
  std::shared_ptr<ClientPipe> client;
  ReplyRoute route;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    switch (frame->header.kind) {
      case FrameKind::kBind: {
        if (express_binds_.size() >= kMaxExpressBinds) {
          // Those of connections gone (their pipes failed before binding).
          absl::erase_if(express_binds_, [](const auto& entry) {
            return entry.second.connection.expired();
          });
        }
        if (express_binds_.size() >= kMaxExpressBinds) {
          refusal = "more express binds than pipes";
          break;
        }
        express_binds_[frame->take_nonce()] =
            ExpressBind{connection, express_peer(*connection)};
        return;
      }
      case FrameKind::kRequest: {
        auto it = express_links_.find(connection.get());
        if (it == express_links_.end() ||
            it->second.connection.lock() != connection) {
          refusal = "an express request on a connection not bound to a pipe";
          break;
        }
        route = ReplyRoute{it->second.pipe, connection};
        break;
      }
      case FrameKind::kResponse:
      case FrameKind::kError: {
        auto it = express_clients_.find(connection.get());
        if (it != express_clients_.end()) client = it->second.lock();
        if (client == nullptr || client->express != connection ||
            !client->server_verified()) {
          refusal = "an express response on a connection of no pipe of ours";
          client = nullptr;
          break;
        }
        client->heard = true;
        break;
      }
      default:
        refusal = absl::StrCat("an express frame of kind ",
                               static_cast<int>(frame->header.kind));
    }
  }
  if (!refusal.empty()) {
    fail_express(connection, refusal);
    return;
  }
  // As the pipe's callbacks do: inside a direct write, on the io thread.
  on_callback(weak_from_this(),
              [client = std::move(client), route = std::move(route),
               frame = std::move(frame)](AgentState& state) {
                if (client != nullptr) {
                  state.deliver_response(client, *frame);
                } else {
                  state.serve_request(route, *frame);
                }
              });
}

void AgentState::drop_server_pipe(
    const std::shared_ptr<::tensorpipe::Pipe>& pipe, absl::string_view why) {
  std::shared_ptr<ClientPipe> adopted;
  {
    absl::MutexLock lock(&mu_);
    server_pipes_.erase(pipe);
    server_auth_.erase(pipe.get());
    opening_.erase(pipe.get());
    unlink_express_locked(pipe);
    auto it = adopted_.find(pipe.get());
    if (it != adopted_.end()) adopted = it->second;
    absl::erase_if(accepted_from_, [&pipe](const auto& entry) {
      return entry.second == pipe;
    });
  }
  pipe->close();
  if (adopted != nullptr) on_client_pipe_error(adopted, why);
}

bool AgentState::on_server_auth(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                                IncomingFrame& frame) {
  const bool is_auth = frame.header.kind == FrameKind::kAuth;
  absl::StatusOr<internal::AuthFrame> auth =
      is_auth ? frame.take_auth() : absl::StatusOr<internal::AuthFrame>();
  bool authenticating = false;
  {
    absl::MutexLock lock(&mu_);
    authenticating = server_auth_.contains(pipe.get());
  }
  if (!authenticating) {
    if (!is_auth) return true;  // authenticated, or no authentication
    if (auth_) {
      refuse(pipe, "?", "an authentication frame after the handshake");
    } else {
      refuse(pipe, auth.ok() ? auth->name : "?",
             absl::StrCat("worker '", self_.name,
                          "' does not authenticate peers (it has no "
                          "secret); the group must agree on one"));
    }
    return false;
  }
  if (!is_auth) {
    refuse(pipe, "?",
           absl::StrCat("worker '", self_.name,
                        "' requires authentication and the peer "
                        "sent a request without it"));
    return false;
  }
  if (!auth.ok()) {
    refuse(pipe, "?", auth.status().message());
    return false;
  }
  if (auth->step == internal::AuthStep::kRefused) {
    refuse(pipe, auth->name, "an unexpected authentication step");
    return false;
  }
  // A dynamic group's joiner connects before the members know it.
  if (auth->step == internal::AuthStep::kHello && !dynamic_ &&
      !peers_.by_name(auth->name).has_value()) {
    refuse(pipe, auth->name, "not a worker of this group");
    return false;
  }
  absl::StatusOr<std::vector<auth::HandshakeMessage>> answer;
  std::string peer;
  bool done = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = server_auth_.find(pipe.get());
    if (it == server_auth_.end()) return false;
    answer = it->second->on_message(handshake_message(*auth));
    peer = it->second->peer();
    done = answer.ok() && it->second->done();
    if (done) server_auth_.erase(it);
  }
  if (!answer.ok()) {
    refuse(pipe, peer.empty() ? auth->name : peer, answer.status().message());
    return false;
  }
  for (const auth::HandshakeMessage& message : *answer) {
    std::shared_ptr<OutgoingFrame> frame = auth_frame(message);
    pipe->write(frame->to_tensorpipe(),
                [frame](const ::tensorpipe::Error& /*error*/) {});
  }
  // The peer proved its name: our requests may go on its pipe.
  if (done) on_pipe_from(pipe, peer);
  return true;
}

void AgentState::refuse(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                        absl::string_view peer, absl::string_view why) {
  LOG(WARNING) << who()
               << " refused a connection from '" << peer << "': " << why;
  std::shared_ptr<ClientPipe> adopted;
  {
    absl::MutexLock lock(&mu_);
    server_pipes_.erase(pipe);
    server_auth_.erase(pipe.get());
    opening_.erase(pipe.get());
    unlink_express_locked(pipe);
    auto it = adopted_.find(pipe.get());
    if (it != adopted_.end()) adopted = it->second;
  }
  std::shared_ptr<OutgoingFrame> refusal = internal::make_auth_frame(
      {internal::AuthStep::kRefused, self_.name, std::string(why)});
  pipe->write(
      refusal->to_tensorpipe(),
      [pipe, refusal](const ::tensorpipe::Error& /*error*/) { pipe->close(); });
  // Our requests on it fail (an authenticated peer's pipe gone bad).
  if (adopted != nullptr) on_client_pipe_error(adopted, why);
}

void AgentState::unlink_express_locked(
    const std::shared_ptr<::tensorpipe::Pipe>& pipe) {
  absl::erase_if(express_links_, [&pipe](const auto& entry) {
    return entry.second.pipe.lock() == pipe || entry.second.pipe.expired();
  });
}

void AgentState::send_response(const ReplyRoute& route, int64_t id,
                               const absl::StatusOr<Message>& result) {
  std::shared_ptr<OutgoingFrame> frame =
      internal::make_response_frame(id, result);
  if (in_tp_callback()) {
    write_response(route, std::move(frame));
    return;
  }
  // Refused only once shut down: then nobody waits for the answer.
  write_directly([this, &route, &frame] { write_response(route, frame); });
}

void AgentState::write_response(const ReplyRoute& route,
                                std::shared_ptr<OutgoingFrame> frame) {
  ::tensorpipe::Message message = frame->to_tensorpipe();
  if (frame->header.inline_data &&
      message.metadata.size() <= kMaxExpressBytes) {
    if (std::shared_ptr<tcp::ConnectionImpl> express = route.express.lock()) {
      // (Lost with the connection, as the pipe's write would be: the sender
      // learns it from the pipe's error.)
      write_express(express, std::move(message.metadata));
      incoming_.answered();
      return;
    }
  }
  std::shared_ptr<::tensorpipe::Pipe> pipe = route.pipe.lock();
  if (pipe == nullptr) {
    // The pipe broke; the sender has failed the request already.
    incoming_.answered();
    return;
  }
  // Out of line, the message is several writes: sent together.
  std::optional<GatheredWrites> gather;
  if (!frame->header.inline_data) gather.emplace();
  pipe->write(std::move(message), [weak = weak_from_this(), frame](
                                      const ::tensorpipe::Error& /*error*/) {
    // On error the pipe is broken: its read loop notices and drops it.
    // Counted here even inside a direct write (answered() only takes its
    // counter's lock): saves waking the io thread once per response.
    if (auto state = weak.lock()) state->incoming_.answered();
  });
}

}  // namespace tether::backends::tensorpipe::internal
