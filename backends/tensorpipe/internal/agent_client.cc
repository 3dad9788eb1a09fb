// The client side of the tensorpipe agent: requests out on a pipe per
// peer (opened on first use, authenticated when a secret is set, or the
// one the peer opened), responses in; the peer's requests on a pipe we
// opened go to the server side.
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <c10/util/Logging.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "backends/common/refusals.h"
#include "backends/tensorpipe/internal/agent_state.h"
#include "backends/tensorpipe/internal/tcp_transport.h"
#include "core/auth/auth.h"

namespace tether::backends::tensorpipe::internal {

// ------------------------------------------------------------- client side

Future<Message> AgentState::start_send(const common::Peer& peer,
                                       Message request,
                                       PendingRequests::Request pending) {
  const int64_t id = pending.id;
  std::shared_ptr<OutgoingFrame> frame =
      internal::make_request_frame(std::move(request));
  const int rank = peer.info.id;
  if (in_tp_callback()) {
    write_request(rank, id, std::move(frame));
  } else if (!write_request_directly(rank, id, frame)) {
    // Refused only once shut down, which has failed the request already.
    post_io([rank, id, frame = std::move(frame)](AgentState& state) mutable {
      state.write_request(rank, id, std::move(frame));
      absl::MutexLock lock(&state.mu_);
      --state.queued_io_writes_;
    });
  }
  return std::move(pending.response);
}

bool AgentState::write_directly(absl::FunctionRef<void()> write) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    ++direct_writes_;
  }
  {
    ScopedMark mark(t_direct_write_of, this);
    write();
  }
  absl::MutexLock lock(&mu_);
  --direct_writes_;
  return true;
}

bool AgentState::write_request_directly(int rank, int64_t id,
                                        std::shared_ptr<OutgoingFrame>& frame) {
  std::shared_ptr<ClientPipe> client;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return true;  // shutdown() has failed the request
    auto it = client_pipes_.find(rank);
    if (queued_io_writes_ > 0 || it == client_pipes_.end() ||
        !it->second->ready) {
      ++queued_io_writes_;
      return false;
    }
    // Written even if it has timed out meanwhile: a timeout ends the
    // caller's wait, not the delivery (PendingRequests::set_connection).
    (void)pending_.set_connection(id, it->second->connection);
    client = it->second;
    ++client->outstanding;
  }
  write_directly(
      [this, &client, &frame] { write_on_client(client, std::move(frame)); });
  return true;
}

// Runs in one of our tensorpipe callbacks or on the io thread; only the io
// thread opens pipes.
void AgentState::write_request(int rank, int64_t id,
                               std::shared_ptr<OutgoingFrame> frame) {
  std::shared_ptr<ClientPipe> client;
  std::shared_ptr<::tensorpipe::Context> context;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    auto it = client_pipes_.find(rank);
    if (it == client_pipes_.end()) {
      // The peer opened a pipe to us: it carries our requests too.
      auto accepted = accepted_from_.find(rank);
      if (accepted != accepted_from_.end()) {
        adopt_locked(rank, accepted->second);
        it = client_pipes_.find(rank);
      }
    }
    if (it != client_pipes_.end()) {
      (void)pending_.set_connection(id, it->second->connection);
      client = it->second;
      ++client->outstanding;
      if (!client->ready) {
        client->queued.emplace_back(id, std::move(frame));
        return;
      }
    } else {
      context = context_;
    }
  }
  if (client == nullptr) {
    // Pipes are opened by top-level io tasks only, one at a time, so a peer
    // never gets two. (tensorpipe may run our callbacks on the io thread while
    // it connects: those must not connect again.) WARNING: closing a pipe
    // that is still connecting can break the peer's listener (tensorpipe
    // fails the listener when an accepted connection dies before its hello).
    if (t_io_task_of != this || t_tp_callback_of == this) {
      post_io([rank, id, frame = std::move(frame)](AgentState& state) mutable {
        state.write_request(rank, id, std::move(frame));
      });
      return;
    }
    std::optional<common::Peer> peer = peers_.by_rank(rank);
    if (!peer.has_value()) {
      pending_.complete(id, common::peer_left(self_.name, "", rank));
      return;
    }
    std::shared_ptr<::tensorpipe::Pipe> pipe;
    std::shared_ptr<tcp::ConnectionImpl> express;
    try {
      OpenedConnection opened;
      pipe = context->connect(
          peer->address,
          ::tensorpipe::PipeOptions().remoteName(peer->info.name));
      express = opened.take();
    } catch (const std::exception& e) {
      pending_.complete(id, absl::UnavailableError(absl::StrCat(
                                "cannot connect to worker '", peer->info.name,
                                "' at ", peer->address, ": ", e.what())));
      return;
    }
    bool inserted = false;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        auto [it, added] = client_pipes_.emplace(rank, nullptr);
        if (added) {
          it->second = std::make_shared<ClientPipe>(
              rank, pipe, next_connection_++,
              auth_ ? std::make_unique<auth::Handshake>(
                          *auth_, auth::Role::kClient, self_.name,
                          peers_.name_of(rank),
                          auth::HandshakeShape::symmetric())
                    : nullptr);
          it->second->express = std::move(express);
        }
        inserted = added;
        client = it->second;
        (void)pending_.set_connection(id, client->connection);
        ++client->outstanding;
        // The peer's pipe may have been accepted while this one connected:
        // then it takes over, and this one goes once answered.
        (void)retire_for_accepted_locked(rank);
      }
    }
    if (!inserted) pipe->close();
    if (client == nullptr) return;  // shut down meanwhile
    if (inserted) {
      read_responses(client);
      if (client->handshake != nullptr) {
        // Our challenge goes first; the requests wait for the server's.
        std::vector<auth::HandshakeMessage> hello;
        {
          absl::MutexLock lock(&mu_);
          hello = client->handshake->start();
        }
        for (const auth::HandshakeMessage& message : hello) {
          write_on_client(client, auth_frame(message));
        }
      } else {
        start_express(client);
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (!client->ready) {
        client->queued.emplace_back(id, std::move(frame));
        return;
      }
    }
  }
  write_on_client(client, std::move(frame));
}

void AgentState::write_on_client(const std::shared_ptr<ClientPipe>& client,
                                 std::shared_ptr<OutgoingFrame> frame) {
  ::tensorpipe::Message message = frame->to_tensorpipe();
  if (frame->header.inline_data &&
      message.metadata.size() <= kMaxExpressBytes &&
      client->express_ready.load(std::memory_order_acquire)) {
    write_express(client->express, std::move(message.metadata));
    return;
  }
  // Out of line, the message is several writes: sent together.
  std::optional<GatheredWrites> gather;
  if (!frame->header.inline_data) gather.emplace();
  client->pipe->write(std::move(message),
                      [weak = weak_from_this(), client,
                       frame](const ::tensorpipe::Error& error) {
                        if (!error) return;
                        on_callback(weak, [client, error](AgentState& state) {
                          state.on_client_pipe_error(client, error);
                        });
                      });
}

void AgentState::on_client_auth(const std::shared_ptr<ClientPipe>& client,
                                const internal::AuthFrame& auth) {
  const std::string peer = peers_.name_of(client->rank);
  auto fail = [&](const std::string& why) {
    on_client_pipe_error(client, why, absl::StatusCode::kUnauthenticated);
  };
  if (auth.step == internal::AuthStep::kRefused) {
    fail(absl::StrCat("worker '", peer, "' refused the connection: ",
                      auth.data));
    return;
  }
  if (client->handshake == nullptr) {
    fail(absl::StrCat("worker '", peer,
                      "' requires authentication and worker '", self_.name,
                      "' has no secret (RpcOptions::auth_secret or ",
                      auth::kSecretEnv, ")"));
    return;
  }
  absl::StatusOr<std::vector<auth::HandshakeMessage>> answer;
  {
    absl::MutexLock lock(&mu_);
    answer = client->handshake->on_message(handshake_message(auth));
  }
  if (!answer.ok()) {
    fail(std::string(answer.status().message()));
    return;
  }
  for (const auth::HandshakeMessage& message : *answer) {
    write_on_client(client, auth_frame(message));
  }
  if (auth.step != internal::AuthStep::kHello) return;
  // The server's challenge is answered. `ready` only once nothing is
  // queued: a direct write (which needs it) never overtakes a queued
  // request.
  std::vector<std::pair<int64_t, std::shared_ptr<OutgoingFrame>>> queued;
  std::shared_ptr<ClientPipe> retired;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (client->queued.empty()) {
        client->ready = true;
        // The peer's pipe, accepted while this one authenticated, may
        // take over now (on_pipe_from).
        retired = retire_for_accepted_locked(client->rank);
        break;
      }
      queued.clear();
      queued.swap(client->queued);
    }
    for (auto& [id, frame] : queued) {
      write_on_client(client, std::move(frame));
    }
  }
  if (retired != nullptr) retired->pipe->close();
  start_express(client);
}

void AgentState::start_express(const std::shared_ptr<ClientPipe>& client) {
  // With another transport too, TensorPipe may move the pipe to a new
  // connection after it opened: only a pipe that stays on this one binds.
  if (client->express == nullptr || my_addresses_.size() != 1 ||
      my_addresses_.count("tcp") == 0) {
    return;
  }
  uint64_t nonce = 0;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    while (nonce == 0) nonce = absl::Uniform<uint64_t>(nonces_);
    client->bind_nonce = nonce;
    express_clients_[client->express.get()] = client;
  }
  // The express one first: the server links the two when the pipe's
  // comes, and the connection carries the express one ahead of it.
  write_express(client->express,
                make_bind_frame(FrameKind::kBind, nonce)->to_tensorpipe()
                    .metadata);
  write_on_client(client, make_bind_frame(FrameKind::kBind, nonce));
}

void AgentState::on_bind_ack(const std::shared_ptr<ClientPipe>& client,
                             const IncomingFrame& frame) {
  const uint64_t nonce = frame.take_nonce();
  absl::MutexLock lock(&mu_);
  if (nonce != 0 && nonce == client->bind_nonce) {
    client->express_ready.store(true, std::memory_order_release);
    return;
  }
  // Not bound (the server could not link it): the pipe carries everything.
  auto it = express_clients_.find(client->express.get());
  if (it != express_clients_.end() && it->second.lock() == client) {
    express_clients_.erase(it);
  }
}

void AgentState::read_responses(std::shared_ptr<ClientPipe> client) {
  std::shared_ptr<::tensorpipe::Pipe> pipe = client->pipe;
  pipe->readDescriptor([weak = weak_from_this(), client = std::move(client)](
                           const ::tensorpipe::Error& error,
                           ::tensorpipe::Descriptor descriptor) {
    on_callback(weak, [client, error,
                       descriptor = std::move(descriptor)](AgentState& state) {
      state.on_response_descriptor(client, error, descriptor);
    });
  });
}

void AgentState::on_response_descriptor(
    const std::shared_ptr<ClientPipe>& client, const ::tensorpipe::Error& error,
    const ::tensorpipe::Descriptor& descriptor) {
  if (error) {
    on_client_pipe_error(client, error);
    return;
  }
  absl::StatusOr<std::shared_ptr<IncomingFrame>> allocated =
      internal::allocate_frame(descriptor, limits_);
  // Requests come too: the peer may send its own on this pipe
  // (on_pipe_from).
  if (!allocated.ok()) {
    on_client_pipe_error(client, allocated.status().ToString());
    return;
  }
  std::shared_ptr<IncomingFrame> frame = *std::move(allocated);
  client->pipe->read(
      frame->allocation, [weak = weak_from_this(), client,
                          frame](const ::tensorpipe::Error& error) {
        if (error) frame->quarantine();
        on_callback(weak, [client, frame, error](AgentState& state) {
          state.on_response(client, frame, error);
        });
      });
}

void AgentState::on_response(const std::shared_ptr<ClientPipe>& client,
                             const std::shared_ptr<IncomingFrame>& frame,
                             const ::tensorpipe::Error& error) {
  if (error) {
    on_client_pipe_error(client, error);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    client->heard = true;
  }
  if (frame->header.kind == FrameKind::kAuth) {
    absl::StatusOr<internal::AuthFrame> auth = frame->take_auth();
    if (!auth.ok()) {
      on_client_pipe_error(client, auth.status().ToString());
      return;
    }
    read_responses(client);
    on_client_auth(client, *auth);
    return;
  }
  bool verified;
  {
    absl::MutexLock lock(&mu_);
    verified = client->server_verified();
  }
  if (!verified) {
    on_client_pipe_error(client, "a message before the server authenticated",
                         absl::StatusCode::kUnauthenticated);
    return;
  }
  read_responses(client);
  if (frame->header.kind == FrameKind::kBindAck) {
    on_bind_ack(client, *frame);
    return;
  }
  if (frame->header.kind == FrameKind::kBind) {
    on_client_pipe_error(client, "a bind frame on a pipe this worker opened",
                         absl::StatusCode::kInvalidArgument);
    return;
  }
  if (frame->header.kind == FrameKind::kRequest) {
    {
      absl::MutexLock lock(&mu_);
      client->serves_peer = true;
    }
    serve_request(ReplyRoute{client->pipe, {}}, *frame);
    return;
  }
  deliver_response(client, *frame);
}

std::shared_ptr<AgentState::ClientPipe> AgentState::adopt_locked(
    int rank, const std::shared_ptr<::tensorpipe::Pipe>& pipe) {
  auto client = std::make_shared<ClientPipe>(rank, pipe, next_connection_++,
                                             /*handshake=*/nullptr,
                                             /*adopted=*/true);
  client_pipes_[rank] = client;
  adopted_[pipe.get()] = client;
  return client;
}

void AgentState::deliver_response(const std::shared_ptr<ClientPipe>& client,
                                  IncomingFrame& frame) {
  bool retired = false;
  {
    absl::MutexLock lock(&mu_);
    --client->outstanding;
    retired = client->retiring && client->outstanding <= 0;
  }
  absl::StatusOr<Message> result = frame.take_result();
  if (!frame.refused.ok()) {
    // Over this worker's limits: read and dropped; the pipe goes on.
    result = absl::Status(
        frame.refused.code(),
        absl::StrCat("worker '", self_.name, "' refuses the response of '",
                     peers_.name_of(client->rank),
                     "': ", frame.refused.message()));
  }
  // A response for an id no longer pending (timed out) is dropped.
  pending_.complete(frame.header.id, std::move(result));
  // Its last request answered, a pipe replaced by the peer's goes.
  if (retired) client->pipe->close();
}

void AgentState::on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                                      absl::string_view what,
                                      absl::StatusCode code) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;  // shutdown() has failed everything
    auto it = client_pipes_.find(client->rank);
    if (it != client_pipes_.end() && it->second == client) {
      client_pipes_.erase(it);
    }
    client->express_ready.store(false, std::memory_order_release);
    auto express = express_clients_.find(client->express.get());
    if (express != express_clients_.end() &&
        express->second.lock() == client) {
      express_clients_.erase(express);
    }
    if (client->adopted) {
      // The peer's pipe: it goes as a server pipe too.
      adopted_.erase(client->pipe.get());
      server_pipes_.erase(client->pipe);
      auto accepted = accepted_from_.find(client->rank);
      if (accepted != accepted_from_.end() &&
          accepted->second == client->pipe) {
        accepted_from_.erase(accepted);
      }
    }
  }
  client->pipe->close();
  std::optional<common::Peer> known = peers_.by_rank(client->rank);
  const std::string peer = known.has_value() ? known->info.name : "";
  pending_.fail_connection(
      client->connection,
      code == absl::StatusCode::kUnauthenticated
          ? absl::UnauthenticatedError(absl::StrCat(
                "worker '", self_.name, "' may not connect to ",
                common::describe_peer(peer, client->rank), ": ", what))
          : common::connection_lost(self_.name, peer, client->rank, what,
                                    code));
}

void AgentState::on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                                      const ::tensorpipe::Error& error) {
  if (std::shared_ptr<internal::RefusedError> refused =
          error.castToType<internal::RefusedError>()) {
    on_client_pipe_error(client, refused->what(),
                         absl::StatusCode::kUnauthenticated);
    return;
  }
  on_client_pipe_error(client, error.what());
}

}  // namespace tether::backends::tensorpipe::internal
