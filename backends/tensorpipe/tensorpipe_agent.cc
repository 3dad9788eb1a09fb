#include "backends/tensorpipe/tensorpipe_agent.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/synchronization/mutex.h>
#include <arpa/inet.h>
#include <c10/util/Logging.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <tensorpipe/tensorpipe.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/common/agent_support.h"
#include "backends/tensorpipe/internal/framing.h"
#include "backends/tensorpipe/internal/serial_executor.h"
#include "core/internal/pending_requests.h"
#include "core/internal/timer.h"
#include "core/join/store_join.h"

namespace tether::backends {
namespace {

using internal::FrameKind;
using internal::IncomingFrame;
using internal::OutgoingFrame;
using internal::SerialExecutor;
using tether::internal::PendingRequests;
using tether::internal::TimerQueue;

constexpr char kBackendName[] = "tensorpipe";
constexpr char kAddressKeyPrefix[] = "tether/tensorpipe/";

constexpr char kTransportsKey[] = "tensorpipe.transports";
constexpr char kChannelsKey[] = "tensorpipe.channels";
constexpr char kMptLanesKey[] = "tensorpipe.mpt_lanes";
constexpr char kAddressKey[] = "tensorpipe.address";
constexpr char kInitTimeoutKey[] = "tensorpipe.init_timeout_ms";

// Higher wins when TensorPipe negotiates a pipe. Shared memory and
// cross-memory attach only work within one host, which TensorPipe checks
// through their domain descriptors; xth only within one process.
constexpr int64_t kShmPriority = 200;
constexpr int64_t kUvPriority = 100;
constexpr int64_t kXthPriority = 1300;
constexpr int64_t kCmaPriority = 1200;
constexpr int64_t kMptPriority = 800;
constexpr int64_t kBasicPriority = 0;

constexpr int kMaxMptLanes = 64;

// How long a failed listener is given to free its addresses.
constexpr int kListenAgainAttempts = 100;
constexpr absl::Duration kListenAgainPause = absl::Milliseconds(20);

// ---------------------------------------------------------------- settings

struct Settings {
  std::vector<std::string> transports = {"uv", "shm"};
  std::vector<std::string> channels = {"basic", "cma", "mpt"};
  int mpt_lanes = 2;
  // What the uv transport listens on: "ip" or "ip:port", IPv6 in brackets.
  std::string address = "127.0.0.1";
  absl::Duration init_timeout = absl::Seconds(60);
};

absl::StatusOr<std::vector<std::string>> parse_list(
    const std::string& key, const std::string& value,
    const std::vector<std::string>& known) {
  std::vector<std::string> names;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    std::string name(absl::StripAsciiWhitespace(part));
    if (name.empty()) continue;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("setting ", key, ": unknown name '", name,
                       "'; known: ", absl::StrJoin(known, ", ")));
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  if (names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting ", key,
                     " names nothing; known: ", absl::StrJoin(known, ", ")));
  }
  return names;
}

// An IP literal as is (IPv6 in brackets), or a network interface's address.
absl::StatusOr<std::string> resolve_address(const std::string& value) {
  in_addr v4;
  in6_addr v6;
  if (inet_pton(AF_INET, value.c_str(), &v4) == 1) return value;
  if (inet_pton(AF_INET6, value.c_str(), &v6) == 1) {
    return absl::StrCat("[", value, "]");
  }
  auto [error, address] =
      ::tensorpipe::transport::uv::lookupAddrForIface(value);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat(
        "setting ", kAddressKey, ": '", value,
        "' is neither an IP address nor a usable network interface (",
        error.what(), ")"));
  }
  return address;
}

absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw) {
  Settings settings;
  for (const auto& [key, value] : raw) {
    if (key.rfind("tensorpipe.", 0) != 0) continue;  // another backend's
    if (key == kTransportsKey) {
      absl::StatusOr<std::vector<std::string>> names =
          parse_list(key, value, {"uv", "shm"});
      if (!names.ok()) return names.status();
      settings.transports = *std::move(names);
    } else if (key == kChannelsKey) {
      absl::StatusOr<std::vector<std::string>> names =
          parse_list(key, value, {"basic", "cma", "mpt", "xth"});
      if (!names.ok()) return names.status();
      settings.channels = *std::move(names);
    } else if (key == kMptLanesKey) {
      if (!absl::SimpleAtoi(value, &settings.mpt_lanes) ||
          settings.mpt_lanes < 1 || settings.mpt_lanes > kMaxMptLanes) {
        return absl::InvalidArgumentError(
            absl::StrCat("setting ", key, ": '", value,
                         "' is not a lane count in [1, ", kMaxMptLanes, "]"));
      }
    } else if (key == kAddressKey) {
      absl::StatusOr<std::string> address = resolve_address(value);
      if (!address.ok()) return address.status();
      settings.address = *std::move(address);
    } else if (key == kInitTimeoutKey) {
      int64_t ms = 0;
      if (!absl::SimpleAtoi(value, &ms) || ms <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "setting ", key, ": '", value, "' is not a positive integer"));
      }
      settings.init_timeout = absl::Milliseconds(ms);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown setting '", key, "'; the tensorpipe backend knows ",
          absl::StrJoin({kTransportsKey, kChannelsKey, kMptLanesKey,
                         kAddressKey, kInitTimeoutKey},
                        ", ")));
    }
  }
  return settings;
}

// tensorpipe aborts the process when a listener cannot bind (it throws on
// its event loop thread), so the agent checks first that `url` can listen:
// "uv://ip[:port]" (IPv6 in brackets) or "shm://name" (an abstract socket;
// an empty name is always free).
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
  } else if (absl::StartsWith(url, "uv://")) {
    std::string host = url.substr(5);
    std::string port_text;
    if (!host.empty() && host[0] == '[') {
      const size_t close = host.find(']');
      if (close == std::string::npos) return fail("unbalanced brackets");
      std::string rest = host.substr(close + 1);
      host = host.substr(1, close - 1);
      if (!rest.empty()) {
        if (rest[0] != ':') return fail("bad port");
        port_text = rest.substr(1);
      }
    } else if (const size_t colon = host.rfind(':');
               colon != std::string::npos) {
      port_text = host.substr(colon + 1);
      host = host.substr(0, colon);
    }
    int port = 0;
    if (!port_text.empty() &&
        (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535)) {
      return fail("bad port");
    }
    auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
    if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
      v4->sin_family = AF_INET;
      v4->sin_port = htons(static_cast<uint16_t>(port));
      length = sizeof(sockaddr_in);
    } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(static_cast<uint16_t>(port));
      length = sizeof(sockaddr_in6);
      family = AF_INET6;
    } else {
      return fail("not an IP address");
    }
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

// ------------------------------------------------------------ thread marks

// Which agent's tensorpipe callback, io task or request handler this thread
// is running (nullptr: none). They decide whether a call may go straight to
// tensorpipe and what shutdown() can wait for. (Timer callbacks are told by
// TimerQueue::running_owner().)
thread_local const void* t_tp_callback_of = nullptr;
thread_local const void* t_io_task_of = nullptr;
thread_local const void* t_handler_of = nullptr;

class Mark {
 public:
  Mark(const void*& slot, const void* value) : slot_(slot), previous_(slot) {
    slot_ = value;
  }
  ~Mark() { slot_ = previous_; }
  Mark(const Mark&) = delete;
  Mark& operator=(const Mark&) = delete;

 private:
  const void*& slot_;
  const void* const previous_;
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
        joiner_(store_, kBackendName, self_.id,
                static_cast<int>(workers_.size())),
        io_(std::make_unique<SerialExecutor>()),
        timers_(std::make_unique<TimerQueue>(/*owner=*/this)),
        pending_(timers_.get()) {
    for (const WorkerInfo& worker : workers_) {
      rank_by_name_[worker.name] = worker.id;
    }
    peer_urls_.resize(workers_.size());
  }

  ~State() {
    // WARNING: this may run on a tensorpipe thread (a callback held the last
    // reference); shutdown() has already taken every tensorpipe object and
    // thread out of here, so nothing below joins a thread.
  }

  absl::Status init();
  absl::Status start(RequestHandler handler);
  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout);
  absl::Status join(absl::Duration timeout);
  void shutdown();

  const WorkerInfo& self() const { return self_; }
  const std::vector<WorkerInfo>& workers() const { return workers_; }

 private:
  struct ClientPipe {
    ClientPipe(int rank, std::shared_ptr<::tensorpipe::Pipe> pipe,
               PendingRequests::Connection connection)
        : rank(rank), pipe(std::move(pipe)), connection(connection) {}
    const int rank;
    const std::shared_ptr<::tensorpipe::Pipe> pipe;
    // What the requests written (or being written) on this pipe are bound
    // to in pending_.
    const PendingRequests::Connection connection;
  };

  // A request that arrived before start().
  struct Deferred {
    std::weak_ptr<::tensorpipe::Pipe> pipe;
    Message request;
  };

  // What shutdown() closes and joins, outside the lock.
  struct Resources {
    std::shared_ptr<::tensorpipe::Context> context;
    std::shared_ptr<::tensorpipe::Listener> listener;
    std::vector<std::shared_ptr<::tensorpipe::Pipe>> pipes;
    std::unique_ptr<SerialExecutor> io;
    std::unique_ptr<TimerQueue> timers;
    std::shared_ptr<const RequestHandler> handler;
    std::vector<Deferred> deferred;

    void close() {
      if (listener) listener->close();
      for (auto& pipe : pipes) pipe->close();
      if (context) context->close();
    }
    // Joins, in this order: our io thread (its last tasks may still call
    // tensorpipe), tensorpipe's threads, the timer thread.
    void join() {
      if (io) io->stop();
      if (context) context->join();
      timers.reset();
      pipes.clear();
      listener.reset();
      context.reset();
      io.reset();
    }
  };

  // Holds the state for a tensorpipe callback and marks the thread.
  class CallbackScope {
   public:
    explicit CallbackScope(const std::weak_ptr<State>& weak)
        : state_(weak.lock()), mark_(t_tp_callback_of, state_.get()) {}
    State* operator->() const { return state_.get(); }
    explicit operator bool() const { return state_ != nullptr; }

   private:
    const std::shared_ptr<State> state_;
    const Mark mark_;
  };

  // True inside one of this agent's tensorpipe callbacks: tensorpipe runs
  // those on its event loop, so calls made here are queued, never run
  // inline.
  bool in_tp_callback() const { return t_tp_callback_of == this; }

  // Runs `task` on the io thread; false once shut down.
  bool post_io(std::function<void(State&)> task) ABSL_LOCKS_EXCLUDED(mu_);

  // Client side.
  void write_request(int rank, int64_t id, std::shared_ptr<OutgoingFrame> frame)
      ABSL_LOCKS_EXCLUDED(mu_);
  void read_responses(std::shared_ptr<ClientPipe> client);
  void on_response_descriptor(const std::shared_ptr<ClientPipe>& client,
                              const ::tensorpipe::Error& error,
                              const ::tensorpipe::Descriptor& descriptor);
  void on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                            absl::string_view what) ABSL_LOCKS_EXCLUDED(mu_);

  // Server side.
  void accept_next(std::shared_ptr<::tensorpipe::Listener> listener);
  void on_accept(const std::shared_ptr<::tensorpipe::Listener>& listener,
                 const ::tensorpipe::Error& error,
                 std::shared_ptr<::tensorpipe::Pipe> pipe)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces a failed listener by one on the same (published) addresses;
  // retries while the old one still holds them.
  void listen_again(int attempt) ABSL_LOCKS_EXCLUDED(mu_);
  void read_requests(std::shared_ptr<::tensorpipe::Pipe> pipe);
  void on_request_descriptor(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                             const ::tensorpipe::Error& error,
                             const ::tensorpipe::Descriptor& descriptor);
  void drop_server_pipe(const std::shared_ptr<::tensorpipe::Pipe>& pipe)
      ABSL_LOCKS_EXCLUDED(mu_);
  void on_request(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                  Message request) ABSL_LOCKS_EXCLUDED(mu_);
  void run_deferred(std::shared_ptr<Deferred> deferred)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Called with handlers_running_ already counted for this call.
  void run_handler(const RequestHandler& handler,
                   std::weak_ptr<::tensorpipe::Pipe> pipe, Message request)
      ABSL_LOCKS_EXCLUDED(mu_);
  void send_response(std::weak_ptr<::tensorpipe::Pipe> pipe, int64_t id,
                     const absl::StatusOr<Message>& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  void write_response(const std::weak_ptr<::tensorpipe::Pipe>& pipe,
                      std::shared_ptr<OutgoingFrame> frame)
      ABSL_LOCKS_EXCLUDED(mu_);
  void finish_incoming() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status register_transports_and_channels(std::vector<std::string>& urls);
  absl::Status exchange_addresses(
      const std::map<std::string, std::string>& mine);

  const WorkerInfo self_;
  const std::vector<WorkerInfo> workers_;
  const std::shared_ptr<c10d::Store> store_;
  const Settings settings_;
  absl::flat_hash_map<std::string, int> rank_by_name_;  // const after ctor
  // Per rank, the url a pipe to it connects to (set by init(), then const);
  // nullopt if we share no transport.
  std::vector<std::optional<std::string>> peer_urls_;
  join::StoreJoin joiner_;

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  common::ShutdownOnce shutdown_;
  std::shared_ptr<const RequestHandler> handler_ ABSL_GUARDED_BY(mu_);
  std::vector<Deferred> deferred_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::shared_ptr<ClientPipe>> client_pipes_
      ABSL_GUARDED_BY(mu_);
  PendingRequests::Connection next_connection_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_set<std::shared_ptr<::tensorpipe::Pipe>> server_pipes_
      ABSL_GUARDED_BY(mu_);
  // Requests received and not yet answered (for join).
  int64_t incoming_active_ ABSL_GUARDED_BY(mu_) = 0;
  // Handler calls in progress (shutdown() waits for them).
  int handlers_running_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<::tensorpipe::Context> context_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<::tensorpipe::Listener> listener_ ABSL_GUARDED_BY(mu_);
  // The urls listener_ listens on, with the addresses peers know (set by
  // init(), then const).
  std::vector<std::string> listening_urls_;
  std::unique_ptr<SerialExecutor> io_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<TimerQueue> timers_ ABSL_GUARDED_BY(mu_);
  // Our requests awaiting their responses. Uses timers_ until shutdown()
  // has cancelled it.
  PendingRequests pending_;
};

// --------------------------------------------------------------- creation

absl::Status State::register_transports_and_channels(
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
    if (name == "uv") {
      transport = ::tensorpipe::transport::uv::create();
      url = absl::StrCat("uv://", settings_.address);
      priority = kUvPriority;
    } else if (name == "shm") {
      transport = ::tensorpipe::transport::shm::create();
      url = "shm://";  // the kernel picks a unique abstract socket name
      priority = kShmPriority;
    }
    if (transport == nullptr || !transport->isViable()) continue;
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
    } else if (name == "xth") {
      channel = ::tensorpipe::channel::xth::create();
      priority = kXthPriority;
    } else if (name == "mpt") {
      std::vector<std::shared_ptr<::tensorpipe::transport::Context>> lanes;
      std::vector<std::shared_ptr<::tensorpipe::transport::Listener>> listeners;
      bool viable = true;
      for (int i = 0; i < settings_.mpt_lanes && viable; ++i) {
        std::shared_ptr<::tensorpipe::transport::Context> lane =
            ::tensorpipe::transport::uv::create();
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

absl::Status State::exchange_addresses(
    const std::map<std::string, std::string>& mine) {
  absl::StatusOr<std::vector<std::string>> published =
      common::exchange_through_store(
          *store_, kAddressKeyPrefix, self_.id,
          static_cast<int>(workers_.size()), encode_addresses(mine),
          settings_.init_timeout,
          absl::StrCat("tensorpipe agent of worker '", self_.name, "'"));
  if (!published.ok()) return published.status();
  for (size_t rank = 0; rank < published->size(); ++rank) {
    std::map<std::string, std::string> theirs =
        decode_addresses((*published)[rank]);
    // Any shared transport will do for the first connection: TensorPipe then
    // moves the pipe to the best one both sides have.
    for (const char* transport : {"uv", "shm"}) {
      if (mine.count(transport) > 0 && theirs.count(transport) > 0) {
        peer_urls_[rank] = absl::StrCat(transport, "://", theirs[transport]);
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status State::init() {
  auto context = std::make_shared<::tensorpipe::Context>(
      ::tensorpipe::ContextOptions().name(self_.name));
  {
    absl::MutexLock lock(&mu_);
    context_ = context;
  }
  // The uv transport and the mpt lanes listen on this address.
  if (absl::Status usable =
          check_can_listen(absl::StrCat("uv://", settings_.address));
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
    addresses = listener->addresses();
    for (const auto& [transport, address] : addresses) {
      listening_urls_.push_back(absl::StrCat(transport, "://", address));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensorpipe agent of worker '", self_.name,
                     "' cannot listen on ", settings_.address, ": ", e.what()));
  }
  {
    absl::MutexLock lock(&mu_);
    listener_ = listener;
  }
  accept_next(listener);
  return exchange_addresses(addresses);
}

absl::Status State::start(RequestHandler handler) {
  std::vector<Deferred> deferred;
  {
    absl::MutexLock lock(&mu_);
    absl::Status installed = common::install_handler(
        std::move(handler), closed_, self_.name, handler_);
    if (!installed.ok()) return installed;
    deferred.swap(deferred_);
  }
  for (Deferred& entry : deferred) {
    auto shared = std::make_shared<Deferred>(std::move(entry));
    post_io([shared](State& state) { state.run_deferred(shared); });
  }
  return absl::OkStatus();
}

bool State::post_io(std::function<void(State&)> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  return io_->post([weak = weak_from_this(), task = std::move(task)] {
    std::shared_ptr<State> state = weak.lock();
    if (state == nullptr) return;
    Mark mark(t_io_task_of, state.get());
    task(*state);
  });
}

// ------------------------------------------------------------- client side

Future<Message> State::send(const WorkerInfo& to, Message request,
                            absl::Duration timeout) {
  auto peer = rank_by_name_.find(to.name);
  absl::StatusOr<PendingRequests::Request> pending;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return Future<Message>::ready(
          common::sent_after_shutdown(self_.name, request.type, to.name));
    }
    if (peer == rank_by_name_.end()) {
      return Future<Message>::ready(absl::UnavailableError(
          absl::StrCat("worker '", to.name, "' is not in the group of worker '",
                       self_.name, "'")));
    }
    if (!peer_urls_[peer->second].has_value()) {
      return Future<Message>::ready(absl::UnavailableError(absl::StrCat(
          "worker '", to.name, "' shares no tensorpipe transport with '",
          self_.name, "'")));
    }
    // Under mu_, so that shutdown() fails it.
    pending = pending_.add(timeout,
                           absl::StrCat(message_type_name(request.type),
                                        " request to worker '", to.name, "'"));
  }
  if (!pending.ok()) return Future<Message>::ready(pending.status());
  const int64_t id = pending->id;
  request.id = id;
  std::shared_ptr<OutgoingFrame> frame =
      internal::make_request_frame(std::move(request));
  const int rank = peer->second;
  if (in_tp_callback()) {
    write_request(rank, id, std::move(frame));
  } else {
    // Refused only once shut down, which has failed the request already.
    post_io([rank, id, frame = std::move(frame)](State& state) mutable {
      state.write_request(rank, id, std::move(frame));
    });
  }
  return std::move(pending->response);
}

// Runs in one of our tensorpipe callbacks or on the io thread; only the io
// thread opens pipes.
void State::write_request(int rank, int64_t id,
                          std::shared_ptr<OutgoingFrame> frame) {
  std::shared_ptr<ClientPipe> client;
  std::shared_ptr<::tensorpipe::Context> context;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    auto it = client_pipes_.find(rank);
    if (it != client_pipes_.end()) {
      if (!pending_.set_connection(id, it->second->connection)) {
        return;  // timed out before it left
      }
      client = it->second;
    } else {
      if (!pending_.contains(id)) return;  // timed out before it left
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
      post_io([rank, id, frame = std::move(frame)](State& state) mutable {
        state.write_request(rank, id, std::move(frame));
      });
      return;
    }
    std::shared_ptr<::tensorpipe::Pipe> pipe;
    try {
      pipe = context->connect(
          *peer_urls_[rank],
          ::tensorpipe::PipeOptions().remoteName(workers_[rank].name));
    } catch (const std::exception& e) {
      pending_.complete(
          id, absl::UnavailableError(absl::StrCat(
                  "cannot connect to worker '", workers_[rank].name, "' at ",
                  *peer_urls_[rank], ": ", e.what())));
      return;
    }
    bool inserted = false;
    bool still_pending = false;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        auto [it, added] = client_pipes_.emplace(rank, nullptr);
        if (added) {
          it->second =
              std::make_shared<ClientPipe>(rank, pipe, next_connection_++);
        }
        inserted = added;
        client = it->second;
        still_pending = pending_.set_connection(id, client->connection);
      }
    }
    if (!inserted) pipe->close();
    if (client == nullptr) return;  // shut down meanwhile
    if (inserted) read_responses(client);
    if (!still_pending) return;
  }
  ::tensorpipe::Message message = frame->to_tensorpipe();
  client->pipe->write(std::move(message),
                      [weak = weak_from_this(), client,
                       frame](const ::tensorpipe::Error& error) {
                        CallbackScope state(weak);
                        if (!state || !error) return;
                        state->on_client_pipe_error(client, error.what());
                      });
}

void State::read_responses(std::shared_ptr<ClientPipe> client) {
  std::shared_ptr<::tensorpipe::Pipe> pipe = client->pipe;
  pipe->readDescriptor([weak = weak_from_this(), client = std::move(client)](
                           const ::tensorpipe::Error& error,
                           ::tensorpipe::Descriptor descriptor) {
    CallbackScope state(weak);
    if (!state) return;
    state->on_response_descriptor(client, error, descriptor);
  });
}

void State::on_response_descriptor(const std::shared_ptr<ClientPipe>& client,
                                   const ::tensorpipe::Error& error,
                                   const ::tensorpipe::Descriptor& descriptor) {
  if (error) {
    on_client_pipe_error(client, error.what());
    return;
  }
  absl::StatusOr<std::unique_ptr<IncomingFrame>> allocated =
      internal::allocate_frame(descriptor);
  if (allocated.ok() && (*allocated)->header.kind == FrameKind::kRequest) {
    allocated = absl::InvalidArgumentError("a request on a client pipe");
  }
  if (!allocated.ok()) {
    on_client_pipe_error(client, allocated.status().ToString());
    return;
  }
  std::shared_ptr<IncomingFrame> frame = *std::move(allocated);
  client->pipe->read(
      frame->allocation, [weak = weak_from_this(), client,
                          frame](const ::tensorpipe::Error& error) {
        CallbackScope state(weak);
        if (!state) return;
        if (error) {
          state->on_client_pipe_error(client, error.what());
          return;
        }
        state->read_responses(client);
        // A response for an id no longer pending (timed out) is dropped.
        state->pending_.complete(frame->header.id, frame->take_result());
      });
}

void State::on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                                 absl::string_view what) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;  // shutdown() has failed everything
    auto it = client_pipes_.find(client->rank);
    if (it != client_pipes_.end() && it->second == client) {
      client_pipes_.erase(it);
    }
  }
  client->pipe->close();
  pending_.fail_connection(
      client->connection,
      absl::UnavailableError(absl::StrCat(
          "lost the connection from worker '", self_.name, "' to worker '",
          workers_[client->rank].name, "' (rank ", client->rank, "): ", what)));
}

// ------------------------------------------------------------- server side

void State::accept_next(std::shared_ptr<::tensorpipe::Listener> listener) {
  ::tensorpipe::Listener& target = *listener;
  target.accept([weak = weak_from_this(), listener = std::move(listener)](
                    const ::tensorpipe::Error& error,
                    std::shared_ptr<::tensorpipe::Pipe> pipe) {
    CallbackScope state(weak);
    if (!state) return;
    state->on_accept(listener, error, std::move(pipe));
  });
}

void State::on_accept(const std::shared_ptr<::tensorpipe::Listener>& listener,
                      const ::tensorpipe::Error& error,
                      std::shared_ptr<::tensorpipe::Pipe> pipe) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_ || listener != listener_) {
      if (pipe != nullptr) pipe->close();
      return;
    }
    if (!error) server_pipes_.insert(pipe);
  }
  if (error) {
    // tensorpipe fails the whole listener when one incoming connection dies
    // before its first packet (a peer that crashed or shut down while
    // connecting). Peers know our addresses: listen on them again.
    LOG(WARNING) << "tensorpipe agent of worker '" << self_.name
                 << "': the listener failed (" << error.what()
                 << "); listening again";
    post_io([](State& state) { state.listen_again(0); });
    return;
  }
  accept_next(listener);
  read_requests(std::move(pipe));
}

void State::listen_again(int attempt) {
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
      timers_->schedule(
          absl::Now() + kListenAgainPause, [weak = weak_from_this(), attempt] {
            std::shared_ptr<State> state = weak.lock();
            if (state == nullptr) return;
            state->post_io(
                [attempt](State& state) { state.listen_again(attempt + 1); });
          });
      return;
    }
    LOG(ERROR) << "tensorpipe agent of worker '" << self_.name
               << "' no longer accepts connections: " << usable.message();
    return;
  }
  std::shared_ptr<::tensorpipe::Listener> listener;
  try {
    listener = context->listen(listening_urls_);
  } catch (const std::exception& e) {
    LOG(ERROR) << "tensorpipe agent of worker '" << self_.name
               << "' cannot listen again on "
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

void State::read_requests(std::shared_ptr<::tensorpipe::Pipe> pipe) {
  ::tensorpipe::Pipe& target = *pipe;
  target.readDescriptor([weak = weak_from_this(), pipe = std::move(pipe)](
                            const ::tensorpipe::Error& error,
                            ::tensorpipe::Descriptor descriptor) {
    CallbackScope state(weak);
    if (!state) return;
    state->on_request_descriptor(pipe, error, descriptor);
  });
}

void State::on_request_descriptor(
    const std::shared_ptr<::tensorpipe::Pipe>& pipe,
    const ::tensorpipe::Error& error,
    const ::tensorpipe::Descriptor& descriptor) {
  if (error) {
    // The peer went away or closed the pipe; its pending requests fail there.
    drop_server_pipe(pipe);
    return;
  }
  absl::StatusOr<std::unique_ptr<IncomingFrame>> allocated =
      internal::allocate_frame(descriptor);
  if (allocated.ok() && (*allocated)->header.kind != FrameKind::kRequest) {
    allocated = absl::InvalidArgumentError("a response on a server pipe");
  }
  if (!allocated.ok()) {
    // Its message cannot be skipped: the pipe is unusable from here on.
    LOG(WARNING) << "tensorpipe agent of worker '" << self_.name
                 << "' drops a connection from '" << pipe->getRemoteName()
                 << "': " << allocated.status().ToString();
    drop_server_pipe(pipe);
    return;
  }
  std::shared_ptr<IncomingFrame> frame = *std::move(allocated);
  pipe->read(frame->allocation, [weak = weak_from_this(), pipe,
                                 frame](const ::tensorpipe::Error& error) {
    CallbackScope state(weak);
    if (!state) return;
    if (error) {
      state->drop_server_pipe(pipe);
      return;
    }
    state->read_requests(pipe);
    absl::StatusOr<Message> request = frame->take_result();
    state->on_request(pipe, *std::move(request));
  });
}

void State::drop_server_pipe(const std::shared_ptr<::tensorpipe::Pipe>& pipe) {
  {
    absl::MutexLock lock(&mu_);
    server_pipes_.erase(pipe);
  }
  pipe->close();
}

void State::on_request(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                       Message request) {
  std::shared_ptr<const RequestHandler> handler;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    ++incoming_active_;
    if (handler_ == nullptr) {
      deferred_.push_back(Deferred{pipe, std::move(request)});
      return;
    }
    handler = handler_;
    ++handlers_running_;
  }
  run_handler(*handler, pipe, std::move(request));
}

void State::run_deferred(std::shared_ptr<Deferred> deferred) {
  std::shared_ptr<const RequestHandler> handler;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    handler = handler_;
    ++handlers_running_;
  }
  run_handler(*handler, deferred->pipe, std::move(deferred->request));
}

void State::run_handler(const RequestHandler& handler,
                        std::weak_ptr<::tensorpipe::Pipe> pipe,
                        Message request) {
  const int64_t id = request.id;
  Future<Message> response;
  {
    Mark mark(t_handler_of, this);
    response = common::call_handler(handler, std::move(request), self_.name);
  }
  {
    absl::MutexLock lock(&mu_);
    --handlers_running_;
  }
  response.on_complete([weak = weak_from_this(), pipe = std::move(pipe),
                        id](const absl::StatusOr<Message>& result) {
    std::shared_ptr<State> state = weak.lock();
    if (state == nullptr) return;
    state->send_response(pipe, id, result);
  });
}

void State::send_response(std::weak_ptr<::tensorpipe::Pipe> pipe, int64_t id,
                          const absl::StatusOr<Message>& result) {
  std::shared_ptr<OutgoingFrame> frame =
      internal::make_response_frame(id, result);
  if (in_tp_callback()) {
    write_response(pipe, std::move(frame));
    return;
  }
  post_io([pipe = std::move(pipe), frame = std::move(frame)](State& state) {
    state.write_response(pipe, frame);
  });
}

void State::write_response(const std::weak_ptr<::tensorpipe::Pipe>& weak_pipe,
                           std::shared_ptr<OutgoingFrame> frame) {
  std::shared_ptr<::tensorpipe::Pipe> pipe = weak_pipe.lock();
  if (pipe == nullptr) {
    // The pipe broke; the sender has failed the request already.
    finish_incoming();
    return;
  }
  ::tensorpipe::Message message = frame->to_tensorpipe();
  pipe->write(std::move(message), [weak = weak_from_this(), frame](
                                      const ::tensorpipe::Error& /*error*/) {
    // On error the pipe is broken: its read loop notices and drops it.
    CallbackScope state(weak);
    if (!state) return;
    state->finish_incoming();
  });
}

void State::finish_incoming() {
  absl::MutexLock lock(&mu_);
  --incoming_active_;
}

// --------------------------------------------------------- join, shutdown

absl::Status State::join(absl::Duration timeout) {
  return common::join_group(joiner_, pending_, mu_, closed_, incoming_active_,
                            self_.name, timeout);
}

void State::shutdown() {
  const bool on_own_thread = t_tp_callback_of == this || t_io_task_of == this ||
                             TimerQueue::running_owner() == this;
  if (!shutdown_.begin(on_own_thread)) return;
  auto resources = std::make_shared<Resources>();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (auto& [rank, client] : client_pipes_) {
      resources->pipes.push_back(client->pipe);
    }
    client_pipes_.clear();
    for (const auto& pipe : server_pipes_) resources->pipes.push_back(pipe);
    server_pipes_.clear();
    resources->context = std::move(context_);
    resources->listener = std::move(listener_);
    resources->io = std::move(io_);
    resources->timers = std::move(timers_);
    // Destroyed outside the lock: they may hold user objects.
    resources->handler = std::move(handler_);
    resources->deferred.swap(deferred_);
  }
  // Before the timers go (resources->join()).
  pending_.cancel_all(absl::CancelledError(absl::StrCat(
      "worker '", self_.name, "' shut down with the request pending")));
  // From here on every pending tensorpipe operation fails; our callbacks see
  // closed_ and do nothing.
  resources->close();
  {
    // Handler calls already started finish before shutdown() returns (the
    // one this thread may be inside of excepted).
    const int own = t_handler_of == this ? 1 : 0;
    absl::MutexLock lock(&mu_);
    auto idle = [this, own]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return handlers_running_ <= own;
    };
    mu_.Await(absl::Condition(&idle));
  }
  shutdown_.finish(on_own_thread, [resources] {
    resources->join();
    *resources = Resources();
  });
}

// ------------------------------------------------------------------- agent

absl::StatusOr<std::unique_ptr<Agent>> create_agent(AgentSetup setup) {
  if (setup.store == nullptr) {
    return absl::InvalidArgumentError(
        "the tensorpipe backend needs the group's rendezvous store");
  }
  absl::StatusOr<Settings> settings = parse_settings(setup.settings);
  if (!settings.ok()) return settings.status();
  return common::start_agent(
      std::make_shared<State>(std::move(setup), *std::move(settings)));
}

}  // namespace

Backend tensorpipe_backend() {
  Backend backend;
  backend.name = kBackendName;
  backend.viable = []() -> absl::Status {
    std::shared_ptr<::tensorpipe::transport::Context> uv =
        ::tensorpipe::transport::uv::create();
    const bool viable = uv->isViable();
    uv->close();
    uv->join();
    if (viable) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "tensorpipe's uv (TCP) transport is not viable on this machine");
  };
  backend.create = create_agent;
  return backend;
}

}  // namespace tether::backends
