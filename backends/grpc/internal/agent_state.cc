#include "backends/grpc/internal/agent_state.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <c10/util/Logging.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "backends/common/refusals.h"

namespace tether::backends::grpc::internal {
namespace {

using tether::internal::SerialExecutor;
using tether::internal::TimerQueue;

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

// A queue's thread: handles each completion of `queue` until it is shut
// down and drained. With a `spin` (RpcOptions::busy_poll) it polls the
// queue for that long after each completion before it sleeps in Next(),
// yielding the core between looks, so that an answer arriving soon after
// is taken without a wake-up (the waiting caller's future polls too:
// core/future.h). A look with a deadline already past still polls gRPC's
// sockets: with it, no thread of a back-to-back call sleeps
// (grpc_backend_test, BusyPollingQueueThreadsDoNotSleepBetweenCalls).
void drive_queue(::grpc::ServerCompletionQueue& queue, absl::Duration spin) {
  void* tag = nullptr;
  bool ok = false;
  const auto spin_for = absl::ToChronoNanoseconds(spin);
  const auto past = std::chrono::system_clock::time_point();
  while (queue.Next(&tag, &ok)) {
    QueueStream::complete(tag, ok);
    if (spin_for.count() <= 0) continue;
    auto until = std::chrono::steady_clock::now() + spin_for;
    for (;;) {
      const auto status = queue.AsyncNext(&tag, &ok, past);
      if (status == ::grpc::CompletionQueue::SHUTDOWN) return;
      if (status == ::grpc::CompletionQueue::GOT_EVENT) {
        QueueStream::complete(tag, ok);
        until = std::chrono::steady_clock::now() + spin_for;
      } else if (std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      } else {
        break;
      }
    }
  }
}

}  // namespace

// --------------------------------------------------------------- creation

absl::Status AgentState::start_server() {
  std::shared_ptr<::grpc::ServerCredentials> credentials;
  const grpc::internal::TlsSettings& tls = settings_.tls;
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
  auto service = std::make_unique<::grpc::AsyncGenericService>();
  builder.RegisterAsyncGenericService(service.get());
  std::vector<std::unique_ptr<Queue>> queues;
  for (int i = 0; i < settings_.completion_threads; ++i) {
    queues.push_back(std::make_unique<Queue>());
    queues.back()->queue = builder.AddCompletionQueue();
  }
  const int frame_limit = static_cast<int>(2 * settings_.chunk_bytes +
                                           grpc::internal::kMaxHeadFrameBytes);
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
    if (server != nullptr) server->Shutdown();
    for (const std::unique_ptr<Queue>& queue : queues) {
      queue->queue->Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (queue->queue->Next(&tag, &ok)) {
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        who(), " cannot listen on ", address,
        " (setting grpc.address)"));
  }
  for (const std::unique_ptr<Queue>& queue : queues) {
    queue->thread = std::thread([queue = queue->queue.get(), owner = this,
                                 spin = busy_poll_] {
      ScopedMark mark(t_completion_of, owner);
      drive_queue(*queue, spin);
    });
    // Waits for a peer's first stream; each arrival asks for the next.
    new ServerStream(weak_from_this(), service.get(), queue->queue.get());
  }
  absl::MutexLock lock(&mu_);
  service_ = std::move(service);
  server_ = std::move(server);
  queues_ = std::move(queues);
  my_address_ = absl::StrCat(settings_.host, ":", port);
  return absl::OkStatus();
}

absl::Status AgentState::init() {
  if (absl::Status started = start_server(); !started.ok()) return started;
  return publish_addresses(my_address_, settings_.init_timeout);
}

void AgentState::remove_peer(const WorkerInfo& worker) {
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

void AgentState::run_deferred_later(Incoming::Deferred deferred) {
  std::shared_ptr<Link> link = deferred.route.lock();
  if (link == nullptr) {
    incoming_.answered();  // its sender has failed it already
    return;
  }
  auto shared = std::make_shared<Incoming::Deferred>(std::move(deferred));
  post([shared](AgentState& state) {
    state.incoming_.run_deferred(std::move(*shared));
  });
}

bool AgentState::post(std::function<void(AgentState&)> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  return tasks_->post([weak = weak_from_this(), task = std::move(task)] {
    std::shared_ptr<AgentState> state = weak.lock();
    if (state == nullptr) return;
    ScopedMark mark(t_completion_of, state.get());
    task(*state);
  });
}

// ------------------------------------------------------------- client side

std::shared_ptr<::grpc::Channel> AgentState::make_channel(
    const std::string& address) const {
  ::grpc::ChannelArguments args;
  const int frame_limit = static_cast<int>(2 * settings_.chunk_bytes +
                                           grpc::internal::kMaxHeadFrameBytes);
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

std::shared_ptr<Link> AgentState::add_link(int rank, const std::string& name,
                                           bool is_client) {
  auto link = std::make_shared<Link>(weak_from_this(), this, self_.name, name,
                                     rank, next_connection_++, is_client,
                                     settings_, limits_, auth_);
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

std::shared_ptr<Link> AgentState::link_for(int rank, int64_t id) {
  std::shared_ptr<Link> link;
  std::shared_ptr<Link> created;
  std::shared_ptr<::grpc::Channel> channel;
  // Lives until the stream has retired (join_resources() waits for it).
  ::grpc::CompletionQueue* queue = nullptr;
  std::optional<common::Peer> peer = peers_.by_rank(rank);
  if (!peer.has_value()) {
    // Left the group meanwhile (dynamic groups). Not inside send().
    fail_later(id, common::peer_left(self_.name, "", rank));
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
      queue = queue_of(*link);
    }
    // Under mu_: a link leaves links_ under it before its requests fail.
    // Sent even if it has timed out meanwhile: a timeout ends the caller's
    // wait, not the delivery (PendingRequests::set_connection).
    (void)pending_.set_connection(id, link->connection());
  }
  // Opened even if the request is gone: the link is in links_ already.
  if (created != nullptr) open_stream(created, std::move(channel), queue);
  return link;
}

void AgentState::open_stream(const std::shared_ptr<Link>& link,
                             std::shared_ptr<::grpc::Channel> channel,
                             ::grpc::CompletionQueue* queue) {
  // Handed to on_link_done() when it retires.
  auto* stream = new ClientStream(link, std::move(channel), queue);
  stream->start(self_, WorkerInfo{link->peer(), link->rank()});
}

Future<Message> AgentState::start_send(const common::Peer& peer,
                                       Message request,
                                       PendingRequests::Request pending) {
  const std::string description =
      absl::StrCat(message_type_name(request.type), " request to worker '",
                   peer.info.name, "'");
  std::shared_ptr<const OutgoingMessage> message =
      grpc::internal::make_request(std::move(request));
  if (absl::Status fits = grpc::internal::check_limits(
          *message, settings_.max_message_bytes, description);
      !fits.ok()) {
    fail_later(pending.id, std::move(fits));
    return std::move(pending.response);
  }
  std::shared_ptr<Link> link = link_for(peer.info.id, pending.id);
  // A link closed meanwhile fails its requests, this one included.
  if (link != nullptr) link->enqueue(std::move(message));
  return std::move(pending.response);
}

// ------------------------------------------------------------- server side

void AgentState::accept(ServerStream& stream) {
  const ::grpc::GenericServerContext& context = stream.context();
  std::shared_ptr<Link> link;
  ::grpc::Status refusal;
  const auto& metadata = context.client_metadata();
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
  const bool member =
      known.has_value() ? known->info.name == name : dynamic_ && !name.empty();
  if (context.method() != kMethod) {
    refusal = ::grpc::Status(
        ::grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("unknown method ", context.method()));
  } else if (!parsed || !member || value(kToNameKey) != self_.name) {
    refusal = ::grpc::Status(
        ::grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("worker '", self_.name, "' (rank ", self_.id,
                     ") refuses a stream from '", name, "' (rank ",
                     value(kFromRankKey), ") meant for '", value(kToNameKey),
                     "': not a member of its group"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      refusal = ::grpc::Status(
          ::grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("worker '", self_.name, "' has shut down"));
    } else {
      // The next call on this queue.
      new ServerStream(weak_from_this(), service_.get(), stream.queue());
      if (refusal.ok()) link = add_link(rank, name, /*is_client=*/false);
    }
  }
  stream.accept(std::move(link), std::move(refusal));
}

void AgentState::on_received(const std::shared_ptr<Link>& link,
                             Received received) {
  if (received.refused) {
    received.result =
        absl::Status(received.result.status().code(),
                     absl::StrCat("worker '", self_.name, "' refuses a ",
                                  received.is_response ? "response" : "request",
                                  ": ", received.result.status().message()));
  }
  if (received.is_response) {
    // A response for an id no longer pending (timed out) is dropped.
    pending_.complete(received.id, std::move(received.result));
    return;
  }
  if (!received.result.ok()) {
    // Refused here (too large): the sender learns why.
    link->enqueue(grpc::internal::make_response(received.id, received.result));
    return;
  }
  incoming_.arrived(std::weak_ptr<Link>(link), *std::move(received.result));
}

void AgentState::send_response(const std::weak_ptr<Link>& weak_link, int64_t id,
                               const absl::StatusOr<Message>& result) {
  std::shared_ptr<const OutgoingMessage> message =
      grpc::internal::make_response(id, result);
  if (absl::Status fits = grpc::internal::check_limits(
          *message, settings_.max_message_bytes,
          absl::StrCat("the response of worker '", self_.name, "'"));
      !fits.ok()) {
    message = grpc::internal::make_response(id, fits);
  }
  // If the link broke, the sender has failed the request already.
  if (std::shared_ptr<Link> link = weak_link.lock()) {
    link->enqueue(std::move(message));
  }
  incoming_.answered();
}

void AgentState::on_link_done(const std::shared_ptr<Link>& link,
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
      // stream keeps this one alive until it is deleted).
      channels_.erase(link->rank());
      retired_streams_.push_back(std::move(client));
    }
  }
  if (closed) return;  // shutdown() has failed everything
  post([](AgentState& state) {
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
  pending_.fail_connection(
      link->connection(),
      code == absl::StatusCode::kUnauthenticated
          ? absl::UnauthenticatedError(absl::StrCat(
                "worker '", self_.name, "' and ",
                common::describe_peer(link->peer(), link->rank()),
                " did not authenticate each other: ", why))
          : common::connection_lost(self_.name, link->peer(), link->rank(),
                                    why, code));
}

// --------------------------------------------------------- join, shutdown

void AgentState::take_resources(Resources& out) {
  for (auto& [rank, list] : links_) {
    for (auto& link : list) out.links.push_back(link);
  }
  out.channels.swap(channels_);
  out.server = std::move(server_);
  out.service = std::move(service_);
  out.queues.swap(queues_);
  out.tasks = std::move(tasks_);
}

void AgentState::close_resources(Resources& resources) {
  for (const auto& link : resources.links) {
    link->close(absl::StrCat("worker '", self_.name, "' shut down"));
  }
}

void AgentState::join_resources(Resources& resources) {
  // Every link has ended its call; the server cancels what it accepted
  // meanwhile (after a grace) and the request for the next call.
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
      LOG(WARNING) << who()
                   << ": " << live_streams_ << " stream(s) still open after "
                   << absl::FormatDuration(kStreamsEndBound) << " of shutdown";
    }
  }
  // Tasks still queued find the agent closed and do nothing.
  if (resources.tasks != nullptr) resources.tasks->stop();
  resources.links.clear();
  resources.channels.clear();
  {
    std::vector<std::unique_ptr<Stream>> retired;
    absl::MutexLock lock(&mu_);
    retired.swap(retired_streams_);
  }
  // Each thread drains its queue (gRPC completes what is still in flight)
  // and ends.
  for (const std::unique_ptr<Queue>& queue : resources.queues) {
    queue->queue->Shutdown();
  }
  for (const std::unique_ptr<Queue>& queue : resources.queues) {
    if (queue->thread.joinable()) queue->thread.join();
  }
  resources.server.reset();
  resources.service.reset();
  resources.queues.clear();
}

}  // namespace tether::backends::grpc::internal
