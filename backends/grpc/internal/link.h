// The gRPC agent's links: one bidirectional stream with a peer, either
// side of it (Link), over the gRPC call under it (Stream: ClientStream for
// a stream this agent opened, ServerStream for one a peer opened, both on
// a completion queue a thread of the agent drives). The agent's state
// (internal/agent_state.h) keeps a table of links per peer and the queues.
//
// Thread safety: a Link's methods may be called from any thread; what gRPC
// completes runs on the agent's queue threads.
#ifndef TETHER_BACKENDS_GRPC_INTERNAL_LINK_H_
#define TETHER_BACKENDS_GRPC_INTERNAL_LINK_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/status.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

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
#include "core/toolkit/pending_requests.h"

namespace tether::backends::grpc::internal {

using common::ScopedMark;
using tether::internal::PendingRequests;

inline constexpr char kMethod[] = "/tether.Agent/Stream";
// Call metadata: who opens a stream, and whom it means to reach.
inline constexpr char kFromRankKey[] = "tether-from-rank";
inline constexpr char kFromNameKey[] = "tether-from-name";
inline constexpr char kToNameKey[] = "tether-to-name";

// Which agent's queue thread or task thread this thread is (nullptr:
// none): shutdown() must not wait for itself. (Request handlers are marked
// by common::IncomingRequests, timer callbacks by
// TimerQueue::running_owner().)
extern thread_local const void* t_completion_of;

class AgentState;

// What a Link needs from the gRPC call under it. Called with the link's
// lock held: gRPC completes nothing inside these calls.
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
// queued for it, the frames arriving on it. Shared by its stream (until it
// retires), the agent's table of links and the callbacks of requests that
// arrived on it (weakly).
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

  // Binds the stream, once, after its call has started.
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

  // What the stream's operations completed with, on a queue thread.
  void on_write_done(bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  void on_read_done(bool ok, const ::grpc::ByteBuffer& buffer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The stream is gone (`status`: gRPC's, for client streams, with the
  // stream itself to delete later, off the thread completing it).
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
  // Ends the call if both a stream and a reason are there.
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

// A stream on one of the agent's completion queues (AgentState::Queue),
// which a thread of the agent drives: every operation's tag is one of the
// stream's Ops, and complete() runs on that thread. Each kind of operation
// has at most one outstanding. Once the call has finished (its Finish
// operation completed) and no operation is outstanding, the stream retires
// (retire()): gRPC is done with it.
class QueueStream : public Stream {
 public:
  enum Kind : int { kStart, kMetadata, kRead, kWrite, kFinish, kKinds };
  struct Op {
    QueueStream* stream;
    Kind kind;
  };

  // On the queue's thread: the operation of `tag` completed.
  static void complete(void* tag, bool ok) {
    Op* op = static_cast<Op*>(tag);
    op->stream->on_complete(op->kind, ok);
  }

  void start_write(const ::grpc::ByteBuffer* buffer) final
      ABSL_LOCKS_EXCLUDED(mu_);
  void start_read() final ABSL_LOCKS_EXCLUDED(mu_);
  void end(absl::StatusCode code, const std::string& why) final
      ABSL_LOCKS_EXCLUDED(mu_);

 protected:
  QueueStream() {
    for (int kind = 0; kind < kKinds; ++kind) {
      ops_[kind] = Op{this, static_cast<Kind>(kind)};
    }
  }

  void* tag(Kind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++outstanding_;
    return &ops_[kind];
  }
  // Whether reads and writes may start (a client's, once its start has
  // completed and the server's initial metadata is in: until then, a write
  // would reuse the start's operations and a read would ask for the
  // metadata again, which gRPC refuses).
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  // A read or write asked for before open_, started when it opens.
  bool deferred_read_ ABSL_GUARDED_BY(mu_) = false;
  const ::grpc::ByteBuffer* deferred_write_ ABSL_GUARDED_BY(mu_) = nullptr;
  // end() was called (or the call failed before it opened): Finish has
  // started or starts once the stream is open; nothing else starts.
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusCode end_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  std::string end_why_ ABSL_GUARDED_BY(mu_);
  ::grpc::ByteBuffer read_buffer_;
  std::shared_ptr<Link> link_;
  mutable absl::Mutex mu_;

  // Starts the opened stream's deferred operations, or its Finish.
  void open() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  // The call's own operations, by the side.
  virtual void read() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void write(const ::grpc::ByteBuffer& buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void finish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // A kStart or kMetadata operation completed (the side's own steps).
  virtual void on_step(Kind kind, bool ok) ABSL_LOCKS_EXCLUDED(mu_) = 0;
  // gRPC is done with the stream: no operation is outstanding and none
  // starts. May delete this.
  virtual void retire() ABSL_LOCKS_EXCLUDED(mu_) = 0;
  // end() before the stream opened: make the call fail, so that it opens
  // (and finishes) at once.
  virtual void cancel() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {}

  void on_complete(Kind kind, bool ok) ABSL_LOCKS_EXCLUDED(mu_);

  Op ops_[kKinds];
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool retired_ ABSL_GUARDED_BY(mu_) = false;

 protected:
  // The call is over for gRPC (its Finish completed, or it never began).
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // A read failed: the call is over (the server finished it, or the
  // connection broke).
  bool read_failed_ ABSL_GUARDED_BY(mu_) = false;
};

// The client side of a stream this agent opened.
class ClientStream final : public QueueStream {
 public:
  ClientStream(std::shared_ptr<Link> link,
               std::shared_ptr<::grpc::Channel> channel,
               ::grpc::CompletionQueue* queue)
      : channel_(std::move(channel)), queue_(queue) {
    link_ = std::move(link);
  }

  // Starts the call and waits (on the queue) for the server's initial
  // metadata; the link may queue meanwhile.
  void start(const WorkerInfo& self, const WorkerInfo& peer)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void read() override { call_->Read(&read_buffer_, tag(kRead)); }
  void write(const ::grpc::ByteBuffer& buffer) override {
    call_->Write(buffer, tag(kWrite));
  }
  void finish() override;
  void on_step(Kind kind, bool ok) override;
  void retire() override;
  void cancel() override { context_.TryCancel(); }

  // The start or the server's initial metadata failed: the call did.
  bool failed_early_ ABSL_GUARDED_BY(mu_) = false;
  int steps_done_ ABSL_GUARDED_BY(mu_) = 0;
  // The call reaches gRPC through the channel object: it lives as long.
  const std::shared_ptr<::grpc::Channel> channel_;
  ::grpc::CompletionQueue* const queue_;
  ::grpc::ClientContext context_;
  std::unique_ptr<::grpc::GenericClientAsyncReaderWriter> call_;
  ::grpc::Status status_;
};

// The server side of a stream: first a request for the next call on its
// queue, then (accepted) a peer's stream with a link, or (refused) a call
// finished at once with why.
class ServerStream final : public QueueStream {
 public:
  ServerStream(std::weak_ptr<AgentState> state,
               ::grpc::AsyncGenericService* service,
               ::grpc::ServerCompletionQueue* queue);

  ::grpc::ServerCompletionQueue* queue() const { return queue_; }
  const ::grpc::GenericServerContext& context() const { return context_; }
  // After the call arrived: serves it on `link`, or refuses it with
  // `refusal` (when `link` is null).
  void accept(std::shared_ptr<Link> link, ::grpc::Status refusal)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void read() override { stream_.Read(&read_buffer_, tag(kRead)); }
  void write(const ::grpc::ByteBuffer& buffer) override {
    stream_.Write(buffer, tag(kWrite));
  }
  void finish() override;
  void on_step(Kind kind, bool ok) override;
  void retire() override;

  const std::weak_ptr<AgentState> state_;
  ::grpc::ServerCompletionQueue* const queue_;
  ::grpc::GenericServerContext context_;
  ::grpc::GenericServerAsyncReaderWriter stream_{&context_};
  ::grpc::Status refusal_;
};

}  // namespace tether::backends::grpc::internal

#endif  // TETHER_BACKENDS_GRPC_INTERNAL_LINK_H_
