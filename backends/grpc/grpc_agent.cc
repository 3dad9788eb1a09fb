#include "backends/grpc/grpc_agent.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <arpa/inet.h>
#include <c10/util/Logging.h>
#include <grpc/grpc.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/common/agent_support.h"
#include "backends/common/peer_table.h"
#include "backends/grpc/internal/framing.h"
#include "backends/grpc/internal/settings.h"
#include "core/auth/auth.h"
#include "core/internal/pending_requests.h"
#include "core/internal/serial_executor.h"
#include "core/internal/timer.h"
#include "core/join/store_join.h"

namespace tether::backends {
namespace {

using common::ScopedMark;
using grpc_internal::Assembler;
using grpc_internal::AuthFrame;
using grpc_internal::AuthStep;
using grpc_internal::FrameKind;
using grpc_internal::OutgoingCursor;
using grpc_internal::OutgoingMessage;
using grpc_internal::Received;
using grpc_internal::Settings;
using tether::internal::PendingRequests;
using tether::internal::SerialExecutor;
using tether::internal::TimerQueue;

constexpr char kBackendName[] = "grpc";
constexpr char kAddressKeyPrefix[] = "tether/grpc/";
constexpr char kMethod[] = "/tether.Agent/Stream";
// Call metadata: who opens a stream, and whom it means to reach.
constexpr char kFromRankKey[] = "tether-from-rank";
constexpr char kFromNameKey[] = "tether-from-name";
constexpr char kToNameKey[] = "tether-to-name";

// At shutdown, how long streams are given to end (they end at once unless
// gRPC is stuck) and the server's calls before it cancels them.
constexpr absl::Duration kStreamsEndBound = absl::Seconds(10);
constexpr absl::Duration kServerShutdownGrace = absl::Seconds(1);

// After a connection fails, how soon a channel tries again (gRPC's default
// starts at 1 s and grows to 120 s; peers of a group come back fast or not
// at all). gRPC's "min reconnect backoff" is left alone: it is also the
// time a connection attempt may take (20 s), which a loaded machine needs.
constexpr int kReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;

// ------------------------------------------------------------ thread marks

// Which agent's gRPC reaction or completion-thread task this thread is
// running (nullptr: none): shutdown() must not wait for itself. (Request
// handlers are marked by common::IncomingRequests, timer callbacks by
// TimerQueue::running_owner().)
thread_local const void* t_reaction_of = nullptr;
thread_local const void* t_completion_of = nullptr;

class State;

// ------------------------------------------------------------------ links

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
  Link(std::weak_ptr<State> state, const void* owner, std::string self,
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
        own_challenge_(auth ? auth->challenge() : std::string()),
        verified_(!auth),
        assembler_(settings.max_message_bytes, limits) {
    if (auth_) {
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
  // Ends the call if both a reactor and a reason are there.
  void end_if_closed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::weak_ptr<State> state_;
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
  const std::string own_challenge_;

  mutable absl::Mutex mu_;
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::string why_ ABSL_GUARDED_BY(mu_);
  absl::StatusCode code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kUnavailable;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Handshake: the peer's challenge once its hello came; whether its proof
  // checked out (messages wait in queue_ until then).
  std::string peer_challenge_ ABSL_GUARDED_BY(mu_);
  bool hello_received_ ABSL_GUARDED_BY(mu_) = false;
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

// ------------------------------------------------------------------- state

// Everything an agent's callbacks touch. Callbacks hold it weakly: a
// callback that fires after the agent is gone finds nothing and returns.
class State : public std::enable_shared_from_this<State> {
 public:
  State(AgentSetup setup, Settings settings)
      : self_(std::move(setup.self)),
        workers_(std::move(setup.workers)),
        store_(std::move(setup.store)),
        settings_(std::move(settings)),
        limits_(setup.limits),
        auth_(std::move(setup.auth)),
        dynamic_(setup.dynamic),
        peers_(workers_),
        peer_timeout_(setup.peer_timeout),
        joiner_(store_, kBackendName, self_.id,
                static_cast<int>(workers_.size())),
        incoming_(self_.name),
        timers_(std::make_unique<TimerQueue>(/*owner=*/this)),
        pending_(timers_.get()) {
    for (int i = 0; i < settings_.completion_threads; ++i) {
      completion_.push_back(std::make_unique<SerialExecutor>());
    }
  }

  ~State() {
    // WARNING: this may run on a gRPC thread (a reaction held the last
    // reference); shutdown() has already taken every gRPC object and thread
    // out of here, so nothing below joins a thread.
  }

  absl::Status init();
  absl::Status start(RequestHandler handler);
  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout);
  absl::Status join(absl::Duration timeout);
  void shutdown();
  absl::Status add_peer(const WorkerInfo& worker);
  void remove_peer(const WorkerInfo& worker) ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerInfo& self() const { return self_; }
  const std::vector<WorkerInfo>& workers() const { return workers_; }

  // For the service: the reactor of an incoming stream.
  ::grpc::ServerGenericBidiReactor* accept(
      ::grpc::GenericCallbackServerContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  // For links: a message arrived whole on `link`.
  void on_received(const std::shared_ptr<Link>& link, Received received);
  // For links: `link`'s stream is gone, `why`. `client` (a client
  // stream's reactor) is deleted later, off gRPC's threads.
  void on_link_done(const std::shared_ptr<Link>& link, absl::string_view why,
                    absl::StatusCode code, std::unique_ptr<Stream> client)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A request's way back: the link it came on.
  using Incoming = common::IncomingRequests<std::weak_ptr<Link>>;

  // What shutdown() closes and joins, outside the lock.
  struct Resources {
    std::shared_ptr<State> state;  // only when joined on a thread of its own
    std::unique_ptr<::grpc::Server> server;
    std::unique_ptr<::grpc::CallbackGenericService> service;
    std::vector<std::shared_ptr<Link>> links;
    absl::flat_hash_map<int, std::shared_ptr<::grpc::Channel>> channels;
    std::vector<std::unique_ptr<SerialExecutor>> completion;
    std::unique_ptr<TimerQueue> timers;
  };

  bool on_own_thread() const {
    return t_reaction_of == this || t_completion_of == this ||
           TimerQueue::running_owner() == this;
  }

  // Runs `task` on `link`'s completion thread; false once shut down.
  bool post(const Link& link, std::function<void(State&)> task)
      ABSL_LOCKS_EXCLUDED(mu_);

  // An open link to `rank` (a new client link if there is none), with
  // request `id` bound to it; nullptr if the request is no longer pending.
  std::shared_ptr<Link> link_for(int rank, int64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<Link> add_link(int rank, const std::string& name,
                                 bool is_client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void open_stream(const std::shared_ptr<Link>& link,
                   std::shared_ptr<::grpc::Channel> channel);
  std::shared_ptr<::grpc::Channel> make_channel(
      const std::string& address) const;

  void send_response(const std::weak_ptr<Link>& link, int64_t id,
                     const absl::StatusOr<Message>& result);

  absl::Status start_server();
  void finish_shutdown(Resources& resources) ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerInfo self_;
  const std::vector<WorkerInfo> workers_;
  const std::shared_ptr<c10d::Store> store_;
  const Settings settings_;
  // What a peer's message may hold (AgentSetup::limits).
  const MessageLimits limits_;
  const std::optional<auth::Authenticator> auth_;
  // A dynamic group (AgentSetup::dynamic): peers come and go, and a worker
  // not known yet may open a stream (to say it joined).
  const bool dynamic_;
  // The peers, each with its "host:port".
  common::PeerTable peers_;
  // This worker's "host:port" (set by start_server()).
  std::string my_address_;
  std::shared_ptr<::grpc::ChannelCredentials> channel_credentials_;
  // Bound of a liveness probe in join() (AgentSetup::peer_timeout).
  const absl::Duration peer_timeout_;
  join::StoreJoin joiner_;

  Incoming incoming_;
  common::ShutdownSequence shutdown_sequence_;

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Per rank, its links (usually one; two if both sides opened at once).
  absl::flat_hash_map<int, std::vector<std::shared_ptr<Link>>> links_
      ABSL_GUARDED_BY(mu_);
  // Links whose reactor has not had its OnDone yet (shutdown waits).
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int, std::shared_ptr<::grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // Reactors of ended client streams. WARNING: gRPC must not destroy a
  // channel inside one of its callbacks, where streams end, and a reactor
  // (its context) may hold the last reference to one: they are deleted on a
  // completion thread, or at shutdown.
  std::vector<std::unique_ptr<Stream>> retired_streams_ ABSL_GUARDED_BY(mu_);
  // Requests given a second stream after theirs ended in the handshake
  // (on_link_done), while they are pending.
  absl::flat_hash_set<int64_t> resent_ ABSL_GUARDED_BY(mu_);
  PendingRequests::Connection next_connection_ ABSL_GUARDED_BY(mu_) = 1;
  std::unique_ptr<::grpc::CallbackGenericService> service_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<::grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<SerialExecutor>> completion_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<TimerQueue> timers_ ABSL_GUARDED_BY(mu_);
  // Our requests awaiting their responses. Uses timers_ until shutdown()
  // has cancelled it.
  PendingRequests pending_;
};

// ---------------------------------------------------------------- reactors

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
    // delete (see State::retired_streams_).
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
  explicit Service(std::weak_ptr<State> state) : state_(std::move(state)) {}

  ::grpc::ServerGenericBidiReactor* CreateReactor(
      ::grpc::GenericCallbackServerContext* context) override {
    std::shared_ptr<State> state = state_.lock();
    if (state == nullptr) {
      return new RefusedStream(
          ::grpc::Status(::grpc::StatusCode::UNAVAILABLE, "shut down"));
    }
    ScopedMark mark(t_reaction_of, state.get());
    return state->accept(context);
  }

 private:
  const std::weak_ptr<State> state_;
};

// ------------------------------------------------------------ link methods

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
    control_.push_back(grpc_internal::make_auth_frame(
        {AuthStep::kHello, self_, own_challenge_}));
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
  if (frame.name != peer_) {
    return absl::UnauthenticatedError(
        absl::StrCat("the peer of worker '", self_, "' on a stream with '",
                     peer_, "' says it is '", frame.name, "'"));
  }
  const auth::Role own_role =
      is_client_ ? auth::Role::kClient : auth::Role::kServer;
  const auth::Role peer_role =
      is_client_ ? auth::Role::kServer : auth::Role::kClient;
  absl::MutexLock lock(&mu_);
  if (frame.step == AuthStep::kHello) {
    if (hello_received_) {
      return absl::UnauthenticatedError(
          absl::StrCat("worker '", peer_, "' sent a second challenge"));
    }
    hello_received_ = true;
    peer_challenge_ = frame.data;
    control_.push_back(grpc_internal::make_auth_frame(
        {AuthStep::kProof, self_,
         auth_->prove(own_role, self_, peer_, frame.data, own_challenge_)}));
  } else {
    if (!hello_received_ || verified_) {
      return absl::UnauthenticatedError(absl::StrCat(
          "worker '", peer_, "' sent a proof out of turn"));
    }
    if (!auth_->verify(frame.data, peer_role, peer_, self_, own_challenge_,
                       peer_challenge_)) {
      return absl::UnauthenticatedError(
          absl::StrCat("worker '", peer_,
                       "' failed to authenticate (a different secret?)"));
    }
    // Every frame after the proof comes from a proven peer.
    verified_ = true;
    assembler_.open_gate();
  }
  if (stream_ != nullptr && !closed_ && !writing_ && can_write()) write_next();
  return absl::OkStatus();
}

void Link::check_authenticated() {
  {
    absl::MutexLock lock(&mu_);
    if (verified_ || closed_) return;
  }
  const std::string why =
      absl::StrCat("worker '", peer_, "' did not authenticate within ",
                   absl::FormatDuration(auth_timeout_));
  LOG(WARNING) << "gRPC agent of worker '" << self_
               << "' refuses a stream with worker '" << peer_ << "': " << why;
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
      LOG(WARNING) << "gRPC agent of worker '" << self_
                   << "' refuses a stream with worker '" << peer_
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
    if (std::shared_ptr<State> state = state_.lock()) {
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
  // The link may go with the reactor: keep it for this call.
  std::shared_ptr<Link> self = shared_from_this();
  if (std::shared_ptr<State> state = state_.lock()) {
    state->on_link_done(self, why, code, std::move(client));
  }
}

// --------------------------------------------------------------- creation

absl::Status State::start_server() {
  std::shared_ptr<::grpc::ServerCredentials> credentials;
  const grpc_internal::TlsSettings& tls = settings_.tls;
  if (tls.enabled()) {
    ::grpc::SslServerCredentialsOptions options(
        tls.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    options.pem_root_certs = tls.root_certs;
    options.pem_key_cert_pairs.push_back({tls.private_key, tls.cert_chain});
    credentials = ::grpc::SslServerCredentials(options);
    ::grpc::SslCredentialsOptions client;
    client.pem_root_certs = tls.root_certs;
    client.pem_private_key = tls.private_key;
    client.pem_cert_chain = tls.cert_chain;
    channel_credentials_ = ::grpc::SslCredentials(client);
  } else {
    credentials = ::grpc::InsecureServerCredentials();
    channel_credentials_ = ::grpc::InsecureChannelCredentials();
  }
  const std::string address = absl::StrCat(settings_.host, ":", settings_.port);
  ::grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, credentials, &port);
  auto service = std::make_unique<Service>(weak_from_this());
  builder.RegisterCallbackGenericService(service.get());
  const int frame_limit = static_cast<int>(2 * settings_.chunk_bytes +
                                           grpc_internal::kMaxHeadFrameBytes);
  builder.SetMaxReceiveMessageSize(frame_limit);
  builder.SetMaxSendMessageSize(frame_limit);
  // Another process must not share our port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (settings_.keepalive > absl::ZeroDuration()) {
    const int keepalive_ms =
        static_cast<int>(absl::ToInt64Milliseconds(settings_.keepalive));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(
                                   settings_.keepalive_timeout)));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  // Peers ping as often as their settings say: never hang up on them for it.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 0);
  std::unique_ptr<::grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gRPC agent of worker '", self_.name, "' cannot listen on ", address,
        " (setting grpc.address)"));
  }
  absl::MutexLock lock(&mu_);
  service_ = std::move(service);
  server_ = std::move(server);
  my_address_ = absl::StrCat(settings_.host, ":", port);
  return absl::OkStatus();
}

namespace {
absl::StatusOr<std::string> as_published(const std::string& address) {
  return address;
}
}  // namespace

absl::Status State::init() {
  if (absl::Status started = start_server(); !started.ok()) return started;
  const std::string who =
      absl::StrCat("gRPC agent of worker '", self_.name, "'");
  if (dynamic_) {
    return common::publish_and_look_up(*store_, kAddressKeyPrefix, self_,
                                       workers_, my_address_, peers_,
                                       as_published, who);
  }
  absl::StatusOr<std::vector<std::string>> addresses =
      common::exchange_addresses(*store_, kAddressKeyPrefix, self_.id,
                                 static_cast<int>(workers_.size()),
                                 my_address_, settings_.init_timeout, who);
  if (!addresses.ok()) return addresses.status();
  for (size_t rank = 0; rank < addresses->size(); ++rank) {
    peers_.set_address(static_cast<int>(rank), (*addresses)[rank]);
  }
  return absl::OkStatus();
}

absl::Status State::add_peer(const WorkerInfo& worker) {
  return common::add_peer(
      *store_, kAddressKeyPrefix, dynamic_, worker, peers_, as_published,
      absl::StrCat("gRPC agent of worker '", self_.name, "'"));
}

void State::remove_peer(const WorkerInfo& worker) {
  if (!peers_.remove(worker)) return;
  // Its links and channel leave the tables, so that a worker joining later
  // with its rank gets its own. Nothing of ours is in flight on them (the
  // Worker drained them), but they stay open until the leaver ends them as
  // it stops: a stream carries both ways, and the answer to its
  // MEMBER_LEAVE goes back on one of them after this returns.
  std::vector<std::shared_ptr<Link>> links;
  std::shared_ptr<::grpc::Channel> channel;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(worker.id);
    if (it != links_.end()) links.swap(it->second);
    auto cached = channels_.find(worker.id);
    if (cached != channels_.end()) {
      channel = std::move(cached->second);
      channels_.erase(cached);
    }
  }
  // WARNING: the links and the channel may not be destroyed on a gRPC
  // thread; this runs on the Worker's pool, and the streams still hold
  // them while they end.
}

absl::Status State::start(RequestHandler handler) {
  absl::StatusOr<std::vector<Incoming::Deferred>> deferred = incoming_.start(
      std::move(handler),
      [weak = weak_from_this()](const std::weak_ptr<Link>& link, int64_t id,
                                const absl::StatusOr<Message>& result) {
        if (std::shared_ptr<State> state = weak.lock()) {
          state->send_response(link, id, result);
        }
      });
  if (!deferred.ok()) return deferred.status();
  for (Incoming::Deferred& entry : *deferred) {
    std::shared_ptr<Link> link = entry.route.lock();
    if (link == nullptr) {
      incoming_.answered();  // its sender has failed it already
      continue;
    }
    auto shared = std::make_shared<Incoming::Deferred>(std::move(entry));
    post(*link, [shared](State& state) {
      state.incoming_.run_deferred(std::move(*shared));
    });
  }
  return absl::OkStatus();
}

bool State::post(const Link& link, std::function<void(State&)> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  SerialExecutor& executor =
      *completion_[link.connection() % completion_.size()];
  return executor.post([weak = weak_from_this(), task = std::move(task)] {
    std::shared_ptr<State> state = weak.lock();
    if (state == nullptr) return;
    ScopedMark mark(t_completion_of, state.get());
    task(*state);
  });
}

// ------------------------------------------------------------- client side

std::shared_ptr<::grpc::Channel> State::make_channel(
    const std::string& address) const {
  ::grpc::ChannelArguments args;
  const int frame_limit = static_cast<int>(2 * settings_.chunk_bytes +
                                           grpc_internal::kMaxHeadFrameBytes);
  args.SetMaxReceiveMessageSize(frame_limit);
  args.SetMaxSendMessageSize(frame_limit);
  if (settings_.keepalive > absl::ZeroDuration()) {
    const int keepalive_ms =
        static_cast<int>(absl::ToInt64Milliseconds(settings_.keepalive));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                static_cast<int>(
                    absl::ToInt64Milliseconds(settings_.keepalive_timeout)));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS,
                keepalive_ms);
  }
  // A channel of its own per peer and per reconnection: no connection (or
  // its backoff) is shared with an earlier channel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  // Retries would buffer whole streams; proxies from the environment would
  // take traffic off the address the peer published.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  if (settings_.tls.enabled() && !settings_.tls.server_name.empty()) {
    args.SetSslTargetNameOverride(settings_.tls.server_name);
  }
  const std::string target =
      absl::StrCat(address[0] == '[' ? "ipv6:" : "ipv4:", address);
  return ::grpc::CreateCustomChannel(target, channel_credentials_, args);
}

std::shared_ptr<Link> State::add_link(int rank, const std::string& name,
                                      bool is_client) {
  auto link = std::make_shared<Link>(weak_from_this(), this, self_.name,
                                     name, rank,
                                     next_connection_++, is_client, settings_,
                                     limits_, auth_);
  links_[rank].push_back(link);
  ++live_streams_;
  if (auth_) {
    timers_->schedule(absl::Now() + settings_.auth_timeout,
                      [weak = std::weak_ptr<Link>(link)] {
                        if (std::shared_ptr<Link> link = weak.lock()) {
                          link->check_authenticated();
                        }
                      });
  }
  return link;
}

std::shared_ptr<Link> State::link_for(int rank, int64_t id) {
  std::shared_ptr<Link> link;
  std::shared_ptr<Link> created;
  std::shared_ptr<::grpc::Channel> channel;
  std::optional<common::Peer> peer = peers_.by_rank(rank);
  if (!peer.has_value()) {
    // Left the group meanwhile (dynamic groups).
    pending_.complete(id, absl::UnavailableError(absl::StrCat(
                              "the worker of rank ", rank,
                              " has left the group of worker '", self_.name,
                              "'")));
    return nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return nullptr;  // shutdown() has failed the request
    for (const std::shared_ptr<Link>& candidate : links_[rank]) {
      if (candidate->is_open()) {
        link = candidate;
        break;
      }
    }
    if (link == nullptr) {
      link = created = add_link(rank, peer->info.name, /*is_client=*/true);
      std::shared_ptr<::grpc::Channel>& cached = channels_[rank];
      if (cached == nullptr) cached = make_channel(peer->address);
      channel = cached;
    }
    // Under mu_: a link leaves links_ under it before its requests fail.
    if (!pending_.set_connection(id, link->connection())) link = nullptr;
  }
  // Opened even if the request is gone: the link is in links_ already.
  if (created != nullptr) open_stream(created, std::move(channel));
  return link;
}

void State::open_stream(const std::shared_ptr<Link>& link,
                        std::shared_ptr<::grpc::Channel> channel) {
  // Deletes itself in OnDone.
  auto* stream = new ClientStream(link, std::move(channel));
  stream->start(self_, WorkerInfo{link->peer(), link->rank()});
}

Future<Message> State::send(const WorkerInfo& to, Message request,
                            absl::Duration timeout) {
  std::optional<common::Peer> peer = peers_.by_name(to.name);
  const std::string description = absl::StrCat(
      message_type_name(request.type), " request to worker '", to.name, "'");
  absl::StatusOr<PendingRequests::Request> pending;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return Future<Message>::ready(absl::CancelledError(
          absl::StrCat("worker '", self_.name, "' has shut down; cannot send ",
                       description)));
    }
    if (!peer.has_value()) {
      return Future<Message>::ready(absl::UnavailableError(
          absl::StrCat("worker '", to.name, "' is not in the group of worker '",
                       self_.name, "'")));
    }
    // Under mu_, so that shutdown() fails it.
    pending = pending_.add(timeout, description);
  }
  if (!pending.ok()) return Future<Message>::ready(pending.status());
  request.id = pending->id;
  std::shared_ptr<const OutgoingMessage> message =
      grpc_internal::make_request(std::move(request));
  if (absl::Status fits = grpc_internal::check_limits(
          *message, settings_.max_message_bytes, description);
      !fits.ok()) {
    pending_.complete(pending->id, fits);
    return std::move(pending->response);
  }
  std::shared_ptr<Link> link = link_for(peer->info.id, pending->id);
  // A link closed meanwhile fails its requests, this one included.
  if (link != nullptr) link->enqueue(std::move(message));
  return std::move(pending->response);
}

// ------------------------------------------------------------- server side

::grpc::ServerGenericBidiReactor* State::accept(
    ::grpc::GenericCallbackServerContext* context) {
  if (context->method() != kMethod) {
    return new RefusedStream(
        ::grpc::Status(::grpc::StatusCode::UNIMPLEMENTED,
                       absl::StrCat("unknown method ", context->method())));
  }
  const auto& metadata = context->client_metadata();
  auto value = [&metadata](const char* key) -> std::string {
    auto it = metadata.find(key);
    if (it == metadata.end()) return "";
    return std::string(it->second.data(), it->second.size());
  };
  int rank = -1;
  const std::string name = value(kFromNameKey);
  // A dynamic group's joiner opens its stream before the members know it:
  // any name whose rank no other peer has will do.
  std::optional<common::Peer> known;
  const bool parsed = absl::SimpleAtoi(value(kFromRankKey), &rank) &&
                      rank >= 0 && rank < (1 << 16);
  if (parsed) known = peers_.by_rank(rank);
  const bool member = known.has_value() ? known->info.name == name
                                        : dynamic_ && !name.empty();
  if (!parsed || !member || value(kToNameKey) != self_.name) {
    return new RefusedStream(::grpc::Status(
        ::grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("worker '", self_.name, "' (rank ", self_.id,
                     ") refuses a stream from '", name, "' (rank ",
                     value(kFromRankKey), ") meant for '", value(kToNameKey),
                     "': not a member of its group")));
  }
  std::shared_ptr<Link> link;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return new RefusedStream(::grpc::Status(
          ::grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("worker '", self_.name, "' has shut down")));
    }
    link = add_link(rank, name, /*is_client=*/false);
  }
  return new ServerStream(std::move(link));
}

void State::on_received(const std::shared_ptr<Link>& link, Received received) {
  if (received.refused) {
    received.result = absl::Status(
        received.result.status().code(),
        absl::StrCat("worker '", self_.name, "' refuses a ",
                     received.is_response ? "response" : "request", ": ",
                     received.result.status().message()));
  }
  if (received.is_response) {
    // A response for an id no longer pending (timed out) is dropped.
    post(*link, [id = received.id,
                 result = std::move(received.result)](State& state) mutable {
      state.pending_.complete(id, std::move(result));
    });
    return;
  }
  if (!received.result.ok()) {
    // Refused here (too large): the sender learns why.
    link->enqueue(grpc_internal::make_response(received.id, received.result));
    return;
  }
  post(*link, [weak = std::weak_ptr<Link>(link),
               request = *std::move(received.result)](State& state) mutable {
    state.incoming_.arrived(std::move(weak), std::move(request));
  });
}

void State::send_response(const std::weak_ptr<Link>& weak_link, int64_t id,
                          const absl::StatusOr<Message>& result) {
  std::shared_ptr<const OutgoingMessage> message =
      grpc_internal::make_response(id, result);
  if (absl::Status fits = grpc_internal::check_limits(
          *message, settings_.max_message_bytes,
          absl::StrCat("the response of worker '", self_.name, "'"));
      !fits.ok()) {
    message = grpc_internal::make_response(id, fits);
  }
  // If the link broke, the sender has failed the request already.
  if (std::shared_ptr<Link> link = weak_link.lock()) {
    link->enqueue(std::move(message));
  }
  incoming_.answered();
}

void State::on_link_done(const std::shared_ptr<Link>& link,
                         absl::string_view why, absl::StatusCode code,
                         std::unique_ptr<Stream> client) {
  bool closed = false;
  {
    absl::MutexLock lock(&mu_);
    closed = closed_;
    --live_streams_;
    auto it = links_.find(link->rank());
    if (it != links_.end()) {
      auto& list = it->second;
      list.erase(std::remove(list.begin(), list.end(), link), list.end());
    }
    if (client != nullptr) {
      // The next stream to this peer starts on a fresh channel (the
      // reactor keeps this one alive until it is deleted).
      channels_.erase(link->rank());
      retired_streams_.push_back(std::move(client));
    }
  }
  if (closed) return;  // shutdown() has failed everything
  post(*link, [](State& state) {
    std::vector<std::unique_ptr<Stream>> retired;
    absl::MutexLock lock(&state.mu_);
    retired.swap(state.retired_streams_);
    // Deleted after the lock (declared before it).
  });
  // Requests that never left because the stream ended during the handshake
  // (the two ends of a pair refusing each other's streams race: one end
  // may see its stream cancelled before it learns why) get one more
  // stream, whose handshake says why if it fails too.
  for (std::shared_ptr<const OutgoingMessage>& message : link->take_unsent()) {
    const int64_t id = message->id;
    {
      absl::MutexLock lock(&mu_);
      absl::erase_if(resent_,
                     [this](int64_t done) { return !pending_.contains(done); });
      if (!resent_.insert(id).second) continue;  // its second stream ended
    }
    std::shared_ptr<Link> next = link_for(link->rank(), id);
    if (next != nullptr) next->enqueue(std::move(message));
  }
  const std::string peer = absl::StrCat("worker '", link->peer(), "' (rank ",
                                        link->rank(), ")");
  pending_.fail_connection(
      link->connection(),
      code == absl::StatusCode::kUnauthenticated
          ? absl::UnauthenticatedError(
                absl::StrCat("worker '", self_.name, "' and ", peer,
                             " did not authenticate each other: ", why))
          : absl::Status(code, absl::StrCat("lost the connection between "
                                            "worker '",
                                            self_.name, "' and ", peer, ": ",
                                            why)));
}

// --------------------------------------------------------- join, shutdown

absl::Status State::join(absl::Duration timeout) {
  return common::join_agent(
      joiner_, pending_, [this] { return incoming_.unanswered(); },
      [this] {
        absl::MutexLock lock(&mu_);
        return closed_;
      },
      self_.name, timeout, common::liveness_of(this, peer_timeout_));
}

void State::finish_shutdown(Resources& resources) {
  // Every link has ended its call; the server finishes what it accepted
  // meanwhile and waits for its reactors.
  if (resources.server != nullptr) {
    resources.server->Shutdown(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(
            absl::ToInt64Milliseconds(kServerShutdownGrace)));
  }
  {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return live_streams_ == 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), kStreamsEndBound)) {
      LOG(WARNING) << "gRPC agent of worker '" << self_.name
                   << "': " << live_streams_ << " stream(s) still open after "
                   << absl::FormatDuration(kStreamsEndBound) << " of shutdown";
    }
  }
  // Tasks still queued find the agent closed and do nothing.
  for (auto& executor : resources.completion) executor->stop();
  resources.timers.reset();
  resources.links.clear();
  resources.channels.clear();
  {
    std::vector<std::unique_ptr<Stream>> retired;
    absl::MutexLock lock(&mu_);
    retired.swap(retired_streams_);
  }
  resources.server.reset();
  resources.service.reset();
}

void State::shutdown() {
  const bool own_thread = on_own_thread();
  if (!shutdown_sequence_.begin(own_thread)) return;
  auto resources = std::make_shared<Resources>();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (auto& [rank, list] : links_) {
      for (auto& link : list) resources->links.push_back(link);
    }
    resources->channels.swap(channels_);
    resources->server = std::move(server_);
    resources->service = std::move(service_);
    resources->completion.swap(completion_);
    resources->timers = std::move(timers_);
  }
  // Before the timers go (finish_shutdown()).
  pending_.cancel_all(absl::CancelledError(absl::StrCat(
      "worker '", self_.name, "' shut down with the request pending")));
  for (const auto& link : resources->links) {
    link->close(absl::StrCat("worker '", self_.name, "' shut down"));
  }
  // Handler calls already started finish first.
  incoming_.close();
  // gRPC's server waits for the reaction this thread may be in, and a
  // completion thread cannot join itself: then another thread finishes.
  // WARNING: it may outlive the agent; it owns everything it touches.
  if (own_thread) resources->state = shared_from_this();
  shutdown_sequence_.finish(own_thread, [this, resources] {
    finish_shutdown(*resources);
    *resources = Resources();
  });
}

// ------------------------------------------------------------------- agent

// gRPC counts its users (channels, servers, credentials) and shuts itself
// down when the last one goes, possibly on one of its own threads through a
// detached cleanup thread; agents come and go (tests make hundreds), so
// each would cycle gRPC down and up, and the process may exit while such a
// cleanup runs. The backend holds gRPC up for the life of the process.
void keep_grpc_initialized() {
  static const bool initialized = [] {
    grpc_init();
    return true;
  }();
  (void)initialized;
}

absl::StatusOr<std::unique_ptr<Agent>> create_agent(AgentSetup setup) {
  keep_grpc_initialized();
  if (setup.store == nullptr) {
    return absl::InvalidArgumentError(
        "the grpc backend needs the group's rendezvous store");
  }
  absl::StatusOr<Settings> settings =
      grpc_internal::parse_settings(setup.settings);
  if (!settings.ok()) return settings.status();
  auto state = std::make_shared<State>(std::move(setup), *std::move(settings));
  absl::Status initialized = state->init();
  if (!initialized.ok()) {
    state->shutdown();
    return initialized;
  }
  return std::make_unique<common::SharedStateAgent<State>>(std::move(state));
}

// OK if this process can open a TCP listener on loopback, which every
// gRPC agent needs (its server listens, its channels connect).
absl::Status check_viable() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the grpc backend (gRPC ", ::grpc::Version(),
                     ") cannot open a TCP socket: ", std::strerror(errno)));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  if (rc == 0) rc = ::listen(fd, 1);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the grpc backend (gRPC ", ::grpc::Version(),
                     ") cannot listen on 127.0.0.1: ", std::strerror(saved)));
  }
  return absl::OkStatus();
}

}  // namespace

Backend grpc_backend() {
  Backend backend;
  backend.name = kBackendName;
  backend.viable = check_viable;
  backend.create = create_agent;
  return backend;
}

}  // namespace tether::backends
