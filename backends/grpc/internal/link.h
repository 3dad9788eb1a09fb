// The gRPC agent's links: one bidirectional stream with a peer, either
// side of it (Link), over the gRPC reactor under it (Stream: ClientStream
// for a stream this agent opened, ServerStream for one a peer opened), and
// the generic service that accepts streams. The agent's state
// (internal/agent_state.h) keeps a table of links per peer.
//
// Thread safety: a Link's methods may be called from any thread; reactions
// run on gRPC's threads.
#ifndef TETHER_BACKENDS_GRPC_INTERNAL_LINK_H_
#define TETHER_BACKENDS_GRPC_INTERNAL_LINK_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/status.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/common/agent_support.h"
#include "backends/grpc/internal/framing.h"
#include "backends/grpc/internal/settings.h"
#include "core/agent.h"
#include "core/auth/auth.h"
#include "core/auth/handshake.h"
#include "core/internal/pending_requests.h"

namespace tether::backends::grpc_internal {

using common::ScopedMark;
using tether::internal::PendingRequests;

inline constexpr char kMethod[] = "/tether.Agent/Stream";
// Call metadata: who opens a stream, and whom it means to reach.
inline constexpr char kFromRankKey[] = "tether-from-rank";
inline constexpr char kFromNameKey[] = "tether-from-name";
inline constexpr char kToNameKey[] = "tether-to-name";

// Which agent's gRPC reaction or completion-thread task this thread is
// running (nullptr: none): shutdown() must not wait for itself. (Request
// handlers are marked by common::IncomingRequests, timer callbacks by
// TimerQueue::running_owner().)
extern thread_local const void* t_reaction_of;
extern thread_local const void* t_completion_of;

class AgentState;

// What a Link needs from the gRPC reactor under it. Called with the link's
// lock held: gRPC never runs a reaction inside these calls.
class Stream {
 public:
  virtual ~Stream() = default;
  // At most one write at a time; `buffer` lives until on_write_done().
  virtual void start_write(const ::grpc::ByteBuffer* buffer) = 0;
  virtual void start_read() = 0;
  // Ends the call (once), telling the peer `code` and `why` where the side
  // allows (a server; a client can only cancel); no operation is started
  // after it.
  virtual void end(absl::StatusCode code, const std::string& why) = 0;
};

// One bidirectional stream with a peer, either side of it: the messages
// queued for it, the frames arriving on it. Shared by its reactor (until
// gRPC's OnDone), the agent's table of links and the callbacks of requests
// that arrived on it (weakly).
class Link : public std::enable_shared_from_this<Link> {
 public:
  // `auth`: the shared secret, when this worker has one (then nothing but
  // the handshake is sent or accepted until the peer has proven it).
  Link(std::weak_ptr<AgentState> state, const void* owner, std::string self,
       std::string peer, int rank, PendingRequests::Connection connection,
       bool is_client, const Settings& settings, const MessageLimits& limits,
       const std::optional<auth::Authenticator>& auth)
      : state_(std::move(state)),
        owner_(owner),
        self_(std::move(self)),
        self_name_(absl::StrCat("worker '", self_, "'")),
        peer_(std::move(peer)),
        rank_(rank),
        connection_(connection),
        is_client_(is_client),
        chunk_bytes_(settings.chunk_bytes),
        auth_timeout_(settings.auth_timeout),
        auth_(auth),
        verified_(!auth),
        assembler_(settings.max_message_bytes, limits) {
    if (auth_) {
      handshake_.emplace(*auth_,
                         is_client_ ? auth::Role::kClient : auth::Role::kServer,
                         self_, peer_);
      assembler_.close_gate(absl::StrCat(
          "worker '", self_, "' requires authentication and worker '", peer_,
          "' sent a message without it"));
    }
  }

  int rank() const { return rank_; }
  const std::string& peer() const { return peer_; }
  PendingRequests::Connection connection() const { return connection_; }
  bool is_client() const { return is_client_; }
  const void* owner() const { return owner_; }

  // Binds the reactor, once, after its call has started.
  void attach(Stream* stream) ABSL_LOCKS_EXCLUDED(mu_);

  bool is_open() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return !closed_;
  }

  // Once the link has ended: the requests queued on it that never left
  // because the stream ended before the handshake finished (none without
  // authentication). Each call takes them.
  std::vector<std::shared_ptr<const OutgoingMessage>> take_unsent()
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return std::move(unsent_);
  }

  // Queues `message`; false (dropped) once the link is closed.
  bool enqueue(std::shared_ptr<const OutgoingMessage> message)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends the stream, once; `why` is what its requests fail with, with
  // `code` (unless gRPC's own status says more). Idempotent.
  void close(absl::string_view why,
             absl::StatusCode code = absl::StatusCode::kUnavailable)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Before the queue is dropped: keeps what never left for take_unsent().
  void keep_unsent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (verified_) return;  // nothing was held back
    for (const OutgoingCursor& cursor : queue_) {
      if (cursor.message().kind == FrameKind::kRequest) {
        unsent_.push_back(cursor.shared_message());
      }
    }
  }

  // Refuses the stream if the peer has not authenticated by now.
  void check_authenticated() ABSL_LOCKS_EXCLUDED(mu_);

  // Reactions, on gRPC's threads.
  void on_write_done(bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  void on_read_done(bool ok, const ::grpc::ByteBuffer& buffer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The stream is gone (`status`: gRPC's, for client streams, with the
  // reactor itself to delete off gRPC's threads).
  void on_done(const std::optional<::grpc::Status>& status,
               std::unique_ptr<Stream> client) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A step of the peer's handshake (from the read reaction, inside
  // assembler_.consume()); UNAUTHENTICATED refuses the stream.
  absl::Status on_auth(const AuthFrame& frame) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether write_next() has something to send.
  bool can_write() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !control_.empty() || (verified_ && !queue_.empty());
  }
  void write_next() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues handshake messages, in the gRPC envelope (auth frames).
  void send_auth(std::vector<auth::HandshakeMessage> messages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the call if both a reactor and a reason are there.
  void end_if_closed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::weak_ptr<AgentState> state_;
  const void* const owner_;
  const std::string self_;
  const std::string self_name_;  // "worker '<name>'", for the peer
  const std::string peer_;
  const int rank_;
  const PendingRequests::Connection connection_;
  const bool is_client_;
  const size_t chunk_bytes_;
  const absl::Duration auth_timeout_;
  const std::optional<auth::Authenticator> auth_;

  mutable absl::Mutex mu_;
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::string why_ ABSL_GUARDED_BY(mu_);
  absl::StatusCode code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kUnavailable;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // The challenge-response (core/auth/handshake.h), when auth_ is set;
  // whether the peer has proven itself (messages wait in queue_ until then).
  std::optional<auth::Handshake> handshake_ ABSL_GUARDED_BY(mu_);
  bool verified_ ABSL_GUARDED_BY(mu_);
  // Handshake frames, sent before anything in queue_.
  std::deque<::grpc::Slice> control_ ABSL_GUARDED_BY(mu_);
  std::deque<OutgoingCursor> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const OutgoingMessage>> unsent_
      ABSL_GUARDED_BY(mu_);
  ::grpc::ByteBuffer write_buffer_ ABSL_GUARDED_BY(mu_);
  // Only the read reaction touches it, one at a time.
  Assembler assembler_;
};

// The client side of a stream this agent opened.
class ClientStream final
    : public ::grpc::ClientBidiReactor<::grpc::ByteBuffer, ::grpc::ByteBuffer>,
      public Stream {
 public:
  ClientStream(std::shared_ptr<Link> link,
               std::shared_ptr<::grpc::Channel> channel)
      : link_(std::move(link)), channel_(std::move(channel)) {}

  void start(const WorkerInfo& self, const WorkerInfo& peer) {
    context_.AddMetadata(kFromRankKey, absl::StrCat(self.id));
    context_.AddMetadata(kFromNameKey, self.name);
    context_.AddMetadata(kToNameKey, peer.name);
    ::grpc::GenericStub stub(channel_);
    stub.PrepareBidiStreamingCall(&context_, kMethod, ::grpc::StubOptions(),
                                  this);
    // Held until the link ends: OnDone waits for it.
    AddHold();
    StartCall();
    link_->attach(this);
  }

  void start_write(const ::grpc::ByteBuffer* buffer) override {
    StartWrite(buffer);
  }
  void start_read() override { StartRead(&read_buffer_); }
  void end(absl::StatusCode /*code*/, const std::string& /*why*/) override {
    // A client can only cancel; the peer sees its stream cancelled. Not
    // once a read failed: the server has ended the call (or the connection
    // broke), and its status, which says why (UNAUTHENTICATED...), is on
    // its way to OnDone; a cancel now would turn it into CANCELLED.
    if (!read_failed_.load(std::memory_order_acquire)) context_.TryCancel();
    RemoveHold();
  }

  void OnReadDone(bool ok) override {
    ScopedMark mark(t_reaction_of, link_->owner());
    if (!ok) read_failed_.store(true, std::memory_order_release);
    link_->on_read_done(ok, read_buffer_);
  }
  void OnWriteDone(bool ok) override {
    ScopedMark mark(t_reaction_of, link_->owner());
    link_->on_write_done(ok);
  }
  void OnDone(const ::grpc::Status& status) override {
    // gRPC is done with this reactor: the link hands it to the state to
    // delete (see AgentState::retired_streams_).
    ScopedMark mark(t_reaction_of, link_->owner());
    link_->on_done(status, std::unique_ptr<Stream>(this));
  }

 private:
  const std::shared_ptr<Link> link_;
  // The call reaches gRPC through the channel object: it lives as long.
  const std::shared_ptr<::grpc::Channel> channel_;
  ::grpc::ClientContext context_;
  ::grpc::ByteBuffer read_buffer_;
  std::atomic<bool> read_failed_{false};
};

// The server side of a stream a peer opened.
class ServerStream final : public ::grpc::ServerGenericBidiReactor,
                           public Stream {
 public:
  explicit ServerStream(std::shared_ptr<Link> link) : link_(std::move(link)) {
    link_->attach(this);
  }

  void start_write(const ::grpc::ByteBuffer* buffer) override {
    StartWrite(buffer);
  }
  void start_read() override { StartRead(&read_buffer_); }
  void end(absl::StatusCode code, const std::string& why) override {
    // absl's codes are gRPC's, number for number.
    Finish(::grpc::Status(static_cast<::grpc::StatusCode>(code), why));
  }

  void OnReadDone(bool ok) override {
    ScopedMark mark(t_reaction_of, link_->owner());
    link_->on_read_done(ok, read_buffer_);
  }
  void OnWriteDone(bool ok) override {
    ScopedMark mark(t_reaction_of, link_->owner());
    link_->on_write_done(ok);
  }
  void OnCancel() override {
    ScopedMark mark(t_reaction_of, link_->owner());
    link_->close("the peer cancelled the stream or its connection broke");
  }
  void OnDone() override {
    {
      ScopedMark mark(t_reaction_of, link_->owner());
      link_->on_done(std::nullopt, nullptr);
    }
    delete this;
  }

 private:
  const std::shared_ptr<Link> link_;
  ::grpc::ByteBuffer read_buffer_;
};

// A stream refused before it had a link: finished at once.
class RefusedStream final : public ::grpc::ServerGenericBidiReactor {
 public:
  explicit RefusedStream(::grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

class Service final : public ::grpc::CallbackGenericService {
 public:
  explicit Service(std::weak_ptr<AgentState> state)
      : state_(std::move(state)) {}

  ::grpc::ServerGenericBidiReactor* CreateReactor(
      ::grpc::GenericCallbackServerContext* context) override;

 private:
  const std::weak_ptr<AgentState> state_;
};

}  // namespace tether::backends::grpc_internal

#endif  // TETHER_BACKENDS_GRPC_INTERNAL_LINK_H_
