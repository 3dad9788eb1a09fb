#include "backends/grpc/internal/link.h"

#include <c10/util/Logging.h>

#include "backends/grpc/internal/agent_state.h"

namespace tether::backends::grpc::internal {

thread_local const void* t_completion_of = nullptr;

void Link::attach(Stream* stream) {
  absl::MutexLock lock(&mu_);
  stream_ = stream;
  if (closed_) {
    end_if_closed();
    return;
  }
  if (auth_) {
    // Both sides open with their challenge; each proves itself on the
    // other's (see on_auth()).
    send_auth(handshake_->start());
  }
  stream_->start_read();
  if (!writing_ && can_write()) write_next();
}

bool Link::enqueue(std::shared_ptr<const OutgoingMessage> message) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  queue_.emplace_back(std::move(message));
  if (stream_ != nullptr && !writing_ && can_write()) write_next();
  return true;
}

absl::Status Link::on_auth(const AuthFrame& frame) {
  if (!auth_) {
    return absl::UnauthenticatedError(
        is_client_
            ? absl::StrCat("worker '", peer_,
                           "' requires authentication and worker '", self_,
                           "' has no secret (RpcOptions::auth_secret or ",
                           auth::kSecretEnv, ")")
            : absl::StrCat("worker '", self_,
                           "' does not authenticate peers (it has no secret: "
                           "RpcOptions::auth_secret or ",
                           auth::kSecretEnv, ") and worker '", peer_,
                           "' does; the group must agree on one"));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::vector<auth::HandshakeMessage>> answer =
      handshake_->on_message({frame.step == AuthStep::kHello
                                  ? auth::HandshakeStep::kHello
                                  : auth::HandshakeStep::kProof,
                              frame.name, frame.data});
  if (!answer.ok()) return answer.status();
  send_auth(*std::move(answer));
  if (handshake_->verified() && !verified_) {
    // Every frame after the proof comes from a proven peer.
    verified_ = true;
    assembler_.open_gate();
  }
  if (stream_ != nullptr && !closed_ && !writing_ && can_write()) write_next();
  return absl::OkStatus();
}

void Link::send_auth(std::vector<auth::HandshakeMessage> messages) {
  for (auth::HandshakeMessage& message : messages) {
    control_.push_back(grpc::internal::make_auth_frame(
        {message.step == auth::HandshakeStep::kHello ? AuthStep::kHello
                                                     : AuthStep::kProof,
         std::move(message.name), std::move(message.data)}));
  }
}

void Link::check_authenticated() {
  {
    absl::MutexLock lock(&mu_);
    if (verified_ || closed_) return;
  }
  const std::string why =
      absl::StrCat("worker '", peer_, "' did not authenticate within ",
                   absl::FormatDuration(auth_timeout_));
  LOG(WARNING) << common::agent_of(kGrpcNames, self_)
               << " refuses a stream with worker '" << peer_ << "': " << why;
  close(why, absl::StatusCode::kUnauthenticated);
}

void Link::write_next() {
  // Handshake frames first. Then frames round robin from the queued
  // messages, up to about one chunk's worth: small messages share a gRPC
  // message, a large one gives way after each chunk.
  std::vector<::grpc::Slice> slices;
  size_t bytes = 0;
  while (!control_.empty()) {
    bytes += control_.front().size();
    slices.push_back(std::move(control_.front()));
    control_.pop_front();
  }
  while (verified_ && !queue_.empty() && bytes < chunk_bytes_) {
    OutgoingCursor cursor = std::move(queue_.front());
    queue_.pop_front();
    bytes += cursor.append_next_frame(chunk_bytes_, slices);
    if (!cursor.done()) queue_.push_back(std::move(cursor));
  }
  ::grpc::ByteBuffer buffer(slices.data(), slices.size());
  write_buffer_.Swap(&buffer);
  writing_ = true;
  stream_->start_write(&write_buffer_);
}

void Link::close(absl::string_view why, absl::StatusCode code) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  closed_ = true;
  why_ = std::string(why);
  code_ = code;
  keep_unsent();
  queue_.clear();
  control_.clear();
  end_if_closed();
}

void Link::end_if_closed() {
  if (!closed_ || ended_ || stream_ == nullptr) return;
  ended_ = true;
  stream_->end(code_, absl::StrCat(self_name_, " ended the stream: ", why_));
}

void Link::on_write_done(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  write_buffer_.Clear();
  // A failed write means a broken call: the read side ends the link.
  if (!ok || closed_ || !can_write()) return;
  write_next();
}

void Link::on_read_done(bool ok, const ::grpc::ByteBuffer& buffer) {
  if (!ok) {
    close(is_client_ ? "the stream ended" : "the peer closed the stream");
    return;
  }
  std::vector<Received> done;
  std::vector<::grpc::Slice> slices;
  absl::Status consumed =
      buffer.Dump(&slices).ok()
          ? assembler_.consume(
                slices, done,
                [this](const AuthFrame& frame) { return on_auth(frame); })
          : absl::InvalidArgumentError("unreadable bytes");
  slices.clear();
  if (!consumed.ok()) {
    if (consumed.code() == absl::StatusCode::kUnauthenticated) {
      LOG(WARNING) << common::agent_of(kGrpcNames, self_)
                   << " refuses a stream with worker '" << peer_
                   << "': " << consumed.message();
      close(consumed.message(), absl::StatusCode::kUnauthenticated);
      return;
    }
    LOG(WARNING) << "gRPC agent: closing a stream with rank " << rank_ << ": "
                 << consumed.message();
    close(consumed.message());
    return;
  }
  if (!done.empty()) {
    if (std::shared_ptr<AgentState> state = state_.lock()) {
      for (Received& received : done) {
        state->on_received(shared_from_this(), std::move(received));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  if (!ended_) stream_->start_read();
}

void Link::on_done(const std::optional<::grpc::Status>& status,
                   std::unique_ptr<Stream> client) {
  std::string why;
  absl::StatusCode code;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    stream_ = nullptr;
    keep_unsent();
    queue_.clear();
    control_.clear();
    why = why_.empty() ? "the stream ended" : why_;
    code = code_;
    if (code_ != absl::StatusCode::kUnauthenticated && status.has_value() &&
        !status->ok() &&
        status->error_code() != ::grpc::StatusCode::CANCELLED) {
      // gRPC knows best why the call ended (connection refused, handshake
      // failed, the peer refused the stream...).
      why = status->error_message();
      if (status->error_code() == ::grpc::StatusCode::UNAUTHENTICATED) {
        code = absl::StatusCode::kUnauthenticated;
      }
    }
  }
  // The link may go with the stream: keep it for this call.
  std::shared_ptr<Link> self = shared_from_this();
  if (std::shared_ptr<AgentState> state = state_.lock()) {
    state->on_link_done(self, why, code, std::move(client));
  }
}

// ----------------------------------------------------------- QueueStream

void QueueStream::start_read() {
  absl::MutexLock lock(&mu_);
  if (finishing_) return;
  if (!open_) {
    deferred_read_ = true;
    return;
  }
  read();
}

void QueueStream::start_write(const ::grpc::ByteBuffer* buffer) {
  absl::MutexLock lock(&mu_);
  if (finishing_) return;
  if (!open_) {
    deferred_write_ = buffer;
    return;
  }
  write(*buffer);
}

void QueueStream::end(absl::StatusCode code, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (finishing_) return;
  finishing_ = true;
  end_code_ = code;
  end_why_ = why;
  if (!open_) {
    cancel();
    return;
  }
  finish_started_ = true;
  finish();
}

void QueueStream::open() {
  open_ = true;
  if (finishing_) {
    if (!finish_started_) {
      finish_started_ = true;
      finish();
    }
    return;
  }
  if (deferred_read_) {
    deferred_read_ = false;
    read();
  }
  if (const ::grpc::ByteBuffer* buffer = std::exchange(deferred_write_, nullptr);
      buffer != nullptr) {
    write(*buffer);
  }
}

void QueueStream::on_complete(Kind kind, bool ok) {
  switch (kind) {
    case kStart:
    case kMetadata:
      on_step(kind, ok);
      break;
    case kRead:
      if (!ok) {
        absl::MutexLock lock(&mu_);
        read_failed_ = true;
      }
      link_->on_read_done(ok, read_buffer_);
      break;
    case kWrite:
      link_->on_write_done(ok);
      break;
    case kFinish: {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      break;
    }
    case kKinds:
      break;
  }
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    if (!finished_ || outstanding_ > 0 || retired_) return;
    retired_ = true;
  }
  retire();
}

// ---------------------------------------------------------- ClientStream

void ClientStream::start(const WorkerInfo& self, const WorkerInfo& peer) {
  context_.AddMetadata(kFromRankKey, absl::StrCat(self.id));
  context_.AddMetadata(kFromNameKey, self.name);
  context_.AddMetadata(kToNameKey, peer.name);
  // Bound first: once its first operation is out, the stream may fail,
  // finish and be deleted on other threads at any time (a peer that is
  // gone refuses the connection at once). Until it opens, the link's reads
  // and writes wait, and an end() cancels the call before it starts.
  link_->attach(this);
  ::grpc::GenericStub stub(channel_);
  void* start = nullptr;
  void* metadata = nullptr;
  ::grpc::GenericClientAsyncReaderWriter* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    call_ = stub.PrepareCall(&context_, kMethod, queue_);
    call = call_.get();
    // Counted now: the stream cannot finish before both have completed
    // (reads and writes wait for both; see QueueStream::open_).
    start = tag(kStart);
    metadata = tag(kMetadata);
  }
  call->StartCall(start);
  call->ReadInitialMetadata(metadata);
}

void ClientStream::finish() {
  // A client can only cancel; the peer sees its stream cancelled. Not once
  // the call failed or a read did: the server has ended the call (or the
  // connection broke), and its status, which says why (UNAUTHENTICATED...),
  // is what Finish brings; a cancel now would turn it into CANCELLED.
  if (!read_failed_ && !failed_early_) context_.TryCancel();
  call_->Finish(&status_, tag(kFinish));
}

void ClientStream::on_step(Kind /*kind*/, bool ok) {
  absl::MutexLock lock(&mu_);
  if (!ok && !failed_early_) {
    failed_early_ = true;
    finishing_ = true;
  }
  // Both the start (whose operations a write reuses) and the metadata.
  if (++steps_done_ == 2) open();
}

void ClientStream::retire() {
  // The link hands the stream to the state to delete later: this very
  // thread is inside it.
  link_->on_done(status_, std::unique_ptr<Stream>(this));
}

// ---------------------------------------------------------- ServerStream

ServerStream::ServerStream(std::weak_ptr<AgentState> state,
                           ::grpc::AsyncGenericService* service,
                           ::grpc::ServerCompletionQueue* queue)
    : state_(std::move(state)), queue_(queue) {
  void* start = nullptr;
  {
    absl::MutexLock lock(&mu_);
    start = tag(kStart);
  }
  // The last use of this here: a call may arrive, be refused and end on
  // the queue's thread before this returns.
  service->RequestCall(&context_, &stream_, queue_, queue_, start);
}

void ServerStream::accept(std::shared_ptr<Link> link, ::grpc::Status refusal) {
  if (link == nullptr) {
    absl::MutexLock lock(&mu_);
    refusal_ = std::move(refusal);
    finishing_ = true;
    open();
    return;
  }
  link_ = std::move(link);
  {
    absl::MutexLock lock(&mu_);
    // The client opens its side once it has these (ClientStream::start).
    stream_.SendInitialMetadata(tag(kMetadata));
    open();
  }
  link_->attach(this);
}

void ServerStream::finish() {
  if (link_ == nullptr) {
    stream_.Finish(refusal_, tag(kFinish));
    return;
  }
  // absl's codes are gRPC's, number for number.
  stream_.Finish(
      ::grpc::Status(static_cast<::grpc::StatusCode>(end_code_), end_why_),
      tag(kFinish));
}

void ServerStream::on_step(Kind kind, bool ok) {
  if (kind != kStart) return;
  if (!ok) {
    // The server is shutting down: no call came.
    absl::MutexLock lock(&mu_);
    finished_ = true;
    return;
  }
  std::shared_ptr<AgentState> state = state_.lock();
  if (state == nullptr) {
    accept(nullptr,
           ::grpc::Status(::grpc::StatusCode::UNAVAILABLE, "shut down"));
    return;
  }
  state->accept(*this);
}

void ServerStream::retire() {
  if (link_ != nullptr) link_->on_done(std::nullopt, nullptr);
  delete this;
}

}  // namespace tether::backends::grpc::internal
