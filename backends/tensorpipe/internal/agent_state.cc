#include "backends/tensorpipe/internal/agent_state.h"

#include <absl/base/attributes.h>
#include <absl/strings/escaping.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <exception>

#include "backends/tensorpipe/internal/cma_write_channel.h"
#include "backends/tensorpipe/internal/tcp_transport.h"

namespace tether::backends::tensorpipe::internal {

thread_local const void* t_tp_callback_of = nullptr;
thread_local const void* t_io_task_of = nullptr;
thread_local const void* t_direct_write_of = nullptr;

namespace {

// Higher wins when TensorPipe negotiates a pipe. Shared memory and
// cross-memory attach only work within one host, which TensorPipe checks
// through their domain descriptors; xth only within one process.
constexpr int64_t kShmPriority = 200;
constexpr int64_t kTcpPriority = 150;
constexpr int64_t kUvPriority = 100;
constexpr int64_t kXthPriority = 1300;
constexpr int64_t kCmaPriority = 1200;
constexpr int64_t kCmaWritePriority = 1250;
constexpr int64_t kMptPriority = 800;
constexpr int64_t kBasicPriority = 0;

// A read of unknown size on the tcp transport (TensorPipe's control
// messages: a descriptor lists every tensor) takes at most this much plus
// this much per storage the limits allow.
constexpr size_t kControlBytes = 1 << 20;
constexpr size_t kControlBytesPerStorage = 256;

// A copy of the listener's addresses. TensorPipe builds each one on its
// transport's loop thread and hands it back through a std::future inside
// libtensorpipe, which is not instrumented: ThreadSanitizer cannot see that
// ordering, so testing/tsan.supp names this function (and only this copy).
ABSL_ATTRIBUTE_NOINLINE std::map<std::string, std::string> listener_addresses(
    const ::tensorpipe::Listener& listener) {
  return listener.addresses();
}

// The listener's addresses, as the store holds them: "transport=address"
// lines.
std::string encode_addresses(const std::map<std::string, std::string>& map) {
  std::string out;
  for (const auto& [transport, address] : map) {
    absl::StrAppend(&out, transport, "=", address, "\n");
  }
  return out;
}

std::map<std::string, std::string> decode_addresses(absl::string_view text) {
  std::map<std::string, std::string> map;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> entry =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    map[entry.first] = entry.second;
  }
  return map;
}

// What TensorPipe negotiates a pipe with, published beside the addresses
// so that either side can tell which transport and channel a pair uses:
// "transport.NAME" and "channel.NAME" -> "PRIORITY:HEX(descriptor)" (the
// transport's domain descriptor, the channel's CPU device descriptor).
constexpr char kTransportOffer[] = "transport.";
constexpr char kChannelOffer[] = "channel.";

void add_offer(std::map<std::string, std::string>& record,
               absl::string_view kind, absl::string_view name,
               int64_t priority, absl::string_view descriptor) {
  record[absl::StrCat(kind, name)] =
      absl::StrCat(priority, ":", absl::BytesToHexString(descriptor));
}

// TensorPipe's rule: of `kind`, the one of highest priority that both
// offer with the same descriptor; "" if none.
std::string negotiated(const std::map<std::string, std::string>& mine,
                       const std::map<std::string, std::string>& theirs,
                       absl::string_view kind) {
  std::string best;
  int64_t best_priority = 0;
  for (const auto& [key, offer] : mine) {
    if (!absl::StartsWith(key, kind)) continue;
    auto other = theirs.find(key);
    if (other == theirs.end() || other->second != offer) continue;
    int64_t priority = 0;
    if (!absl::SimpleAtoi(offer.substr(0, offer.find(':')), &priority)) {
      continue;
    }
    if (best.empty() || priority > best_priority) {
      best = key.substr(kind.size());
      best_priority = priority;
    }
  }
  return best;
}

}  // namespace

absl::Status check_can_listen(const std::string& url) {
  auto fail = [&url](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on ", url, ": ", why));
  };
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_INET;
  if (absl::StartsWith(url, "shm://")) {
    const std::string name = url.substr(6);
    if (name.empty()) return absl::OkStatus();
    auto* un = reinterpret_cast<sockaddr_un*>(&storage);
    if (name.size() + 1 > sizeof(un->sun_path)) return fail("name too long");
    un->sun_family = AF_UNIX;
    un->sun_path[0] = '\0';  // abstract namespace
    std::memcpy(un->sun_path + 1, name.data(), name.size());
    length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                    name.size());
    family = AF_UNIX;
  } else if (absl::StartsWith(url, "uv://") ||
             absl::StartsWith(url, "tcp://")) {
    if (!internal::parse_socket_address(url.substr(url.find("://") + 3),
                                        &storage, &length)) {
      return fail("not an IP address (and port)");
    }
    family = storage.ss_family;
  } else {
    return fail("unknown transport");
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(std::strerror(errno));
  if (family != AF_UNIX) {
    const int on = 1;  // as libuv does for TCP listeners
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  }
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&storage), length);
  if (rc == 0) rc = ::listen(fd, 1);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) return fail(std::strerror(saved));
  return absl::OkStatus();
}

// --------------------------------------------------------------- creation

absl::Status AgentState::register_transports_and_channels(
    std::vector<std::string>& urls) {
  // Only init() touches the context before it is shared.
  std::shared_ptr<::tensorpipe::Context> context;
  {
    absl::MutexLock lock(&mu_);
    context = context_;
  }
  for (const std::string& name : settings_.transports) {
    std::shared_ptr<::tensorpipe::transport::Context> transport;
    std::string url;
    int64_t priority = 0;
    if (name == "tcp") {
      transport = make_tcp_transport();
      url = absl::StrCat("tcp://", settings_.address);
      priority = kTcpPriority;
    } else if (name == "uv") {
      transport = ::tensorpipe::transport::uv::create();
      url = absl::StrCat("uv://", settings_.address);
      priority = kUvPriority;
    } else if (name == "shm") {
      transport = ::tensorpipe::transport::shm::create();
      url = "shm://";  // the kernel picks a unique abstract socket name
      priority = kShmPriority;
    }
    if (transport == nullptr || !transport->isViable()) continue;
    add_offer(my_offer_, kTransportOffer, name, priority,
              transport->domainDescriptor());
    context->registerTransport(priority, name, std::move(transport));
    urls.push_back(std::move(url));
  }
  if (urls.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("none of the tensorpipe transports [",
                     absl::StrJoin(settings_.transports, ", "),
                     "] is viable on this machine"));
  }
  int channels = 0;
  for (const std::string& name : settings_.channels) {
    std::shared_ptr<::tensorpipe::channel::Context> channel;
    int64_t priority = 0;
    if (name == "basic") {
      channel = ::tensorpipe::channel::basic::create();
      priority = kBasicPriority;
    } else if (name == "cma") {
      channel = ::tensorpipe::channel::cma::create();
      priority = kCmaPriority;
    } else if (name == "cma_write") {
      channel = internal::create_cma_write_channel();
      priority = kCmaWritePriority;
    } else if (name == "xth") {
      channel = ::tensorpipe::channel::xth::create();
      priority = kXthPriority;
    } else if (name == "mpt") {
      std::vector<std::shared_ptr<::tensorpipe::transport::Context>> lanes;
      std::vector<std::shared_ptr<::tensorpipe::transport::Listener>> listeners;
      bool viable = true;
      for (int i = 0; i < settings_.mpt_lanes && viable; ++i) {
        // Each lane listens: on tether's guarded transport, whatever
        // carries the pipes.
        std::shared_ptr<::tensorpipe::transport::Context> lane =
            make_tcp_transport();
        viable = lane->isViable();
        if (viable) listeners.push_back(lane->listen(settings_.address));
        lanes.push_back(std::move(lane));
      }
      if (!viable) {
        for (auto& lane : lanes) {
          lane->close();
          lane->join();
        }
        continue;
      }
      channel = ::tensorpipe::channel::mpt::create(std::move(lanes),
                                                   std::move(listeners));
      priority = kMptPriority;
    }
    if (channel == nullptr || !channel->isViable()) continue;
    const auto& descriptors = channel->deviceDescriptors();
    auto cpu = descriptors.find(
        ::tensorpipe::Device{::tensorpipe::kCpuDeviceType, 0});
    if (cpu != descriptors.end()) {
      add_offer(my_offer_, kChannelOffer, name, priority, cpu->second);
    }
    context->registerChannel(priority, name, std::move(channel));
    ++channels;
  }
  if (channels == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("none of the tensorpipe channels [",
                     absl::StrJoin(settings_.channels, ", "),
                     "] is viable on this machine"));
  }
  return absl::OkStatus();
}

std::shared_ptr<::tensorpipe::transport::Context>
AgentState::make_tcp_transport() {
  internal::TcpTransportOptions options;
  options.self = self_.name;
  // A dynamic group's members change: none listed lets any name through
  // the handshake (authentication, if set, still applies).
  for (const WorkerInfo& worker : workers_) {
    if (!dynamic_) options.members.push_back(worker.name);
  }
  options.auth = auth_;
  options.max_unsized_read_bytes =
      kControlBytes +
      kControlBytesPerStorage *
          static_cast<size_t>(std::max<int64_t>(0, limits_.max_storages));
  options.handshake_timeout = settings_.handshake_timeout;
  options.connect_timeout = peer_timeout_;
  options.poll = poll_;
  options.log_prefix =
      who();
  options.express_sink =
      [weak = weak_from_this()](
          const std::shared_ptr<tcp::ConnectionImpl>& connection,
          absl::string_view bytes) {
        if (std::shared_ptr<AgentState> state = weak.lock()) {
          state->on_express(connection, bytes);
        }
      };
  return internal::create_tcp_transport(std::move(options));
}

std::string AgentState::url_to(const std::string& published) const {
  std::map<std::string, std::string> theirs = decode_addresses(published);
  // Any shared transport will do for the first connection: TensorPipe then
  // moves the pipe to the best one both sides have.
  for (const char* transport : {"tcp", "uv", "shm"}) {
    if (my_addresses_.count(transport) > 0 && theirs.count(transport) > 0) {
      return absl::StrCat(transport, "://", theirs[transport]);
    }
  }
  return "";
}

void AgentState::remove_peer(const WorkerInfo& worker) {
  if (!peers_.remove(worker)) return;
  // Its pipe goes, so that a worker joining later with its rank gets one of
  // its own. Nothing is in flight on it (the Worker drained it first).
  std::shared_ptr<ClientPipe> client;
  {
    absl::MutexLock lock(&mu_);
    accepted_from_.erase(worker.id);
    auto it = client_pipes_.find(worker.id);
    if (it == client_pipes_.end()) return;
    client = std::move(it->second);
    client_pipes_.erase(it);
    if (client->adopted) adopted_.erase(client->pipe.get());
  }
  client->pipe->close();
}

absl::Status AgentState::init() {
  auto context = std::make_shared<::tensorpipe::Context>(
      ::tensorpipe::ContextOptions().name(self_.name));
  {
    absl::MutexLock lock(&mu_);
    context_ = context;
  }
  // The TCP transports and the mpt lanes listen on this address.
  if (absl::Status usable =
          check_can_listen(absl::StrCat("tcp://", settings_.address));
      !usable.ok()) {
    return usable;
  }
  std::map<std::string, std::string> addresses;
  std::shared_ptr<::tensorpipe::Listener> listener;
  try {
    std::vector<std::string> urls;
    absl::Status registered = register_transports_and_channels(urls);
    if (!registered.ok()) return registered;
    listener = context->listen(urls);
    addresses = listener_addresses(*listener);
    for (const auto& [transport, address] : addresses) {
      listening_urls_.push_back(absl::StrCat(transport, "://", address));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(),
                     " cannot listen on ", settings_.address, ": ", e.what()));
  }
  {
    absl::MutexLock lock(&mu_);
    listener_ = listener;
  }
  accept_next(listener);
  my_addresses_ = addresses;
  std::map<std::string, std::string> record = addresses;
  record.insert(my_offer_.begin(), my_offer_.end());
  return publish_addresses(encode_addresses(record), settings_.init_timeout);
}

absl::StatusOr<PeerLink> AgentState::link_to(const WorkerInfo& worker) const {
  std::optional<common::Peer> peer = peers_.by_name(worker.name);
  if (!(peer.has_value() && peer->info == worker)) {
    return absl::NotFoundError(absl::StrCat("worker '", worker.name,
                                            "' (rank ", worker.id,
                                            ") is not a peer of ", who()));
  }
  absl::StatusOr<std::string> published = common::lookup_address(
      *store_, kTensorPipeNames.address_key_prefix, worker, who());
  if (!published.ok()) return published.status();
  const std::map<std::string, std::string> theirs =
      decode_addresses(*published);
  PeerLink link{negotiated(my_offer_, theirs, kTransportOffer),
                negotiated(my_offer_, theirs, kChannelOffer)};
  if (link.transport.empty() || link.channel.empty()) {
    return absl::UnavailableError(
        absl::StrCat(who(), " shares no ",
                     link.transport.empty() ? "transport" : "channel",
                     " with worker '", worker.name, "'"));
  }
  return link;
}

void AgentState::run_deferred_later(Incoming::Deferred deferred) {
  auto shared = std::make_shared<Incoming::Deferred>(std::move(deferred));
  post_io([shared](AgentState& state) {
    state.incoming_.run_deferred(std::move(*shared));
  });
}

bool AgentState::post_io(std::function<void(AgentState&)> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  return io_->post([weak = weak_from_this(), task = std::move(task)] {
    std::shared_ptr<AgentState> state = weak.lock();
    if (state == nullptr) return;
    ScopedMark mark(t_io_task_of, state.get());
    task(*state);
  });
}

// --------------------------------------------------------- join, shutdown

void AgentState::take_resources(Resources& out) {
  // No direct write starts from here on; those under way finish before
  // tensorpipe is closed and joined. (None runs on this thread: work of
  // callbacks met inside a direct write goes to the io thread.)
  auto no_direct_writes = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return direct_writes_ == 0;
  };
  if (t_direct_write_of != this) {
    mu_.Await(absl::Condition(&no_direct_writes));
  }
  for (auto& [rank, client] : client_pipes_) {
    out.pipes.push_back(client->pipe);
  }
  client_pipes_.clear();
  express_clients_.clear();
  express_binds_.clear();
  express_links_.clear();
  adopted_.clear();
  accepted_from_.clear();
  opening_.clear();
  // (An adopted pipe is in both: closing it twice is harmless.)
  for (const auto& pipe : server_pipes_) out.pipes.push_back(pipe);
  server_pipes_.clear();
  out.context = std::move(context_);
  out.listener = std::move(listener_);
  out.io = std::move(io_);
}

void AgentState::close_resources(Resources& resources) {
  if (resources.listener) resources.listener->close();
  for (auto& pipe : resources.pipes) pipe->close();
  if (resources.context) resources.context->close();
}

void AgentState::join_resources(Resources& resources) {
  if (resources.io) resources.io->stop();
  if (resources.context) resources.context->join();
}

std::shared_ptr<OutgoingFrame> AgentState::auth_frame(
    const auth::HandshakeMessage& message) {
  return internal::make_auth_frame(
      {message.step == auth::HandshakeStep::kHello ? internal::AuthStep::kHello
                                                   : internal::AuthStep::kProof,
       message.name, message.data});
}

auth::HandshakeMessage AgentState::handshake_message(
    const internal::AuthFrame& frame) {
  return {frame.step == internal::AuthStep::kHello ? auth::HandshakeStep::kHello
                                                   : auth::HandshakeStep::kProof,
          frame.name, frame.data};
}

}  // namespace tether::backends::tensorpipe::internal
