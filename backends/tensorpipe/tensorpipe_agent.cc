#include "backends/tensorpipe/tensorpipe_agent.h"

#include <absl/base/attributes.h>
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
#include <absl/synchronization/notification.h>
#include <arpa/inet.h>
#include <c10/util/Logging.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <tensorpipe/tensorpipe.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backends/common/agent_support.h"
#include "backends/common/peer_table.h"
#include "backends/tensorpipe/internal/framing.h"
#include "backends/tensorpipe/internal/tcp_transport.h"
#include "core/auth/auth.h"
#include "core/internal/pending_requests.h"
#include "core/internal/serial_executor.h"
#include "core/internal/timer.h"
#include "core/join/store_join.h"

namespace tether::backends {
namespace {

using common::ScopedMark;
using internal::FrameKind;
using internal::IncomingFrame;
using internal::OutgoingFrame;
using tether::internal::PendingRequests;
using tether::internal::SerialExecutor;
using tether::internal::TimerQueue;

constexpr char kBackendName[] = "tensorpipe";
constexpr char kAddressKeyPrefix[] = "tether/tensorpipe/";

constexpr char kTransportsKey[] = "tensorpipe.transports";
constexpr char kChannelsKey[] = "tensorpipe.channels";
constexpr char kMptLanesKey[] = "tensorpipe.mpt_lanes";
constexpr char kAddressKey[] = "tensorpipe.address";
constexpr char kInitTimeoutKey[] = "tensorpipe.init_timeout_ms";
constexpr char kHandshakeTimeoutKey[] = "tensorpipe.handshake_timeout_ms";

// Higher wins when TensorPipe negotiates a pipe. Shared memory and
// cross-memory attach only work within one host, which TensorPipe checks
// through their domain descriptors; xth only within one process.
constexpr int64_t kShmPriority = 200;
constexpr int64_t kTcpPriority = 150;
constexpr int64_t kUvPriority = 100;
constexpr int64_t kXthPriority = 1300;
constexpr int64_t kCmaPriority = 1200;
constexpr int64_t kMptPriority = 800;
constexpr int64_t kBasicPriority = 0;

constexpr int kMaxMptLanes = 64;

// A read of unknown size on the tcp transport (TensorPipe's control
// messages: a descriptor lists every tensor) takes at most this much plus
// this much per storage the limits allow.
constexpr size_t kControlBytes = 1 << 20;
constexpr size_t kControlBytesPerStorage = 256;

// How long a failed listener is given to free its addresses.
constexpr int kListenAgainAttempts = 100;
constexpr absl::Duration kListenAgainPause = absl::Milliseconds(20);

// ---------------------------------------------------------------- settings

struct Settings {
  // "tcp" is tether's guarded transport (internal/tcp_transport.h); "uv"
  // and "shm" are TensorPipe's own, which a stranger's bytes can crash
  // (docs/security.md), so only on request.
  std::vector<std::string> transports = {"tcp"};
  std::vector<std::string> channels = {"basic", "cma", "mpt"};
  int mpt_lanes = 2;
  // What the uv transport listens on: "ip" or "ip:port", IPv6 in brackets.
  std::string address = "127.0.0.1";
  absl::Duration init_timeout = absl::Seconds(60);
  absl::Duration handshake_timeout = absl::Seconds(10);
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
          parse_list(key, value, {"tcp", "uv", "shm"});
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
    } else if (key == kHandshakeTimeoutKey) {
      int64_t ms = 0;
      if (!absl::SimpleAtoi(value, &ms) || ms <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "setting ", key, ": '", value, "' is not a positive integer"));
      }
      settings.handshake_timeout = absl::Milliseconds(ms);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown setting '", key, "'; the tensorpipe backend knows ",
          absl::StrJoin({kTransportsKey, kChannelsKey, kMptLanesKey,
                         kAddressKey, kInitTimeoutKey, kHandshakeTimeoutKey},
                        ", ")));
    }
  }
  return settings;
}

// tensorpipe aborts the process when a listener cannot bind (it throws on
// its event loop thread), so the agent checks first that `url` can listen:
// "uv://ip[:port]" or "tcp://ip[:port]" (IPv6 in brackets) or "shm://name"
// (an abstract socket; an empty name is always free).
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

// ------------------------------------------------------------ thread marks

// Which agent's tensorpipe callback or io task this thread is running
// (nullptr: none). They decide whether a call may go straight to tensorpipe
// and what shutdown() can wait for. (Request handlers are marked by
// common::IncomingRequests, timer callbacks by TimerQueue::running_owner().)
thread_local const void* t_tp_callback_of = nullptr;
thread_local const void* t_io_task_of = nullptr;
// Which agent's direct write (State::write_directly) this thread is inside.
thread_local const void* t_direct_write_of = nullptr;

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
        auth_(setup.auth),
        dynamic_(setup.dynamic),
        peers_(workers_),
        peer_timeout_(setup.peer_timeout),
        joiner_(store_, kBackendName, self_.id,
                static_cast<int>(workers_.size())),
        incoming_(self_.name),
        io_(std::make_unique<SerialExecutor>()),
        timers_(std::make_unique<TimerQueue>(/*owner=*/this)),
        pending_(timers_.get()) {}

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
  absl::Status add_peer(const WorkerInfo& worker);
  void remove_peer(const WorkerInfo& worker);

  const WorkerInfo& self() const { return self_; }
  const std::vector<WorkerInfo>& workers() const { return workers_; }

 private:
  struct ClientPipe {
    ClientPipe(int rank, std::shared_ptr<::tensorpipe::Pipe> pipe,
               PendingRequests::Connection connection, bool authenticate)
        : rank(rank),
          pipe(std::move(pipe)),
          connection(connection),
          ready(!authenticate),
          server_verified(!authenticate) {}
    const int rank;
    const std::shared_ptr<::tensorpipe::Pipe> pipe;
    // What the requests written (or being written) on this pipe are bound
    // to in pending_.
    const PendingRequests::Connection connection;
    // Authentication (under State::mu_): requests wait in `queued` until
    // this side has answered the server's challenge (`ready`); responses are
    // accepted once the server has answered ours (`server_verified`).
    bool ready;
    bool server_verified;
    std::string own_challenge;
    std::string server_challenge;
    std::vector<std::pair<int64_t, std::shared_ptr<OutgoingFrame>>> queued;
  };

  // A server pipe's authentication (under mu_).
  struct ServerAuth {
    enum class Stage { kAwaitHello, kAwaitProof } stage = Stage::kAwaitHello;
    std::string own_challenge;
    std::string peer;
    std::string peer_challenge;
  };

  // A request's way back: the pipe it came on.
  using Incoming = common::IncomingRequests<std::weak_ptr<::tensorpipe::Pipe>>;

  // What shutdown() closes and joins, outside the lock.
  struct Resources {
    std::shared_ptr<::tensorpipe::Context> context;
    std::shared_ptr<::tensorpipe::Listener> listener;
    std::vector<std::shared_ptr<::tensorpipe::Pipe>> pipes;
    std::unique_ptr<SerialExecutor> io;
    std::unique_ptr<TimerQueue> timers;

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
    State& operator*() const { return *state_; }
    explicit operator bool() const { return state_ != nullptr; }

   private:
    const std::shared_ptr<State> state_;
    const ScopedMark mark_;
  };

  // Runs `work(State&)` for one of this agent's tensorpipe callbacks.
  // TensorPipe runs callbacks on whichever thread drives its loop, and a
  // thread that enters the loop to write (a direct write, below: a user's
  // thread in send(), the pool's with a response) drains what other threads
  // queued meanwhile. There `work` goes to the io thread instead, so that no
  // future completes inside send() or under its caller's locks.
  template <typename Work>
  static void on_callback(const std::weak_ptr<State>& weak, Work work) {
    if (t_direct_write_of != nullptr) {
      std::shared_ptr<State> state = weak.lock();
      if (state == nullptr) return;
      state->post_io([work = std::move(work)](State& state) mutable {
        ScopedMark mark(t_tp_callback_of, &state);
        work(state);
      });
      return;
    }
    CallbackScope state(weak);
    if (!state) return;
    work(*state);
  }

  // True inside one of this agent's tensorpipe callbacks: tensorpipe runs
  // those on its event loop, so calls made here are queued, never run
  // inline.
  bool in_tp_callback() const { return t_tp_callback_of == this; }

  // Runs `write` (which enters tensorpipe) on this thread, counted so that
  // shutdown() waits for it before joining tensorpipe's threads; false (and
  // nothing done) once shut down. Saves the hand-off to the io thread and
  // its wake-up, most of a small call's cost on a loaded machine.
  bool write_directly(const std::function<void()>& write)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A request from a thread that is not ours goes straight to its pipe
  // when that pipe is ready and nothing queued on the io thread could be
  // overtaken (a thread's requests leave in the order it sent them); false
  // when the io thread must write it (counted in queued_io_writes_).
  bool write_request_directly(int rank, int64_t id,
                              std::shared_ptr<OutgoingFrame>& frame)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `task` on the io thread; false once shut down.
  bool post_io(std::function<void(State&)> task) ABSL_LOCKS_EXCLUDED(mu_);

  // Client side.
  void write_request(int rank, int64_t id, std::shared_ptr<OutgoingFrame> frame)
      ABSL_LOCKS_EXCLUDED(mu_);
  void read_responses(std::shared_ptr<ClientPipe> client);
  void on_response_descriptor(const std::shared_ptr<ClientPipe>& client,
                              const ::tensorpipe::Error& error,
                              const ::tensorpipe::Descriptor& descriptor);
  void on_response(const std::shared_ptr<ClientPipe>& client,
                   const std::shared_ptr<IncomingFrame>& frame,
                   const ::tensorpipe::Error& error);
  void on_client_pipe_error(
      const std::shared_ptr<ClientPipe>& client, absl::string_view what,
      absl::StatusCode code = absl::StatusCode::kUnavailable)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A tensorpipe error: UNAUTHENTICATED if the tcp transport's handshake
  // refused the connection, else UNAVAILABLE.
  void on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                            const ::tensorpipe::Error& error)
      ABSL_LOCKS_EXCLUDED(mu_);
  void write_on_client(const std::shared_ptr<ClientPipe>& client,
                       std::shared_ptr<OutgoingFrame> frame);
  void on_client_auth(const std::shared_ptr<ClientPipe>& client,
                      const internal::AuthFrame& auth) ABSL_LOCKS_EXCLUDED(mu_);

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
  // Handles a frame of a server pipe still authenticating; false if it
  // was refused (and dropped).
  bool on_server_auth(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                      IncomingFrame& frame) ABSL_LOCKS_EXCLUDED(mu_);
  // Tells the peer why, logs it, and drops the pipe.
  void refuse(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
              absl::string_view peer, absl::string_view why)
      ABSL_LOCKS_EXCLUDED(mu_);
  void send_response(std::weak_ptr<::tensorpipe::Pipe> pipe, int64_t id,
                     const absl::StatusOr<Message>& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  void write_response(const std::weak_ptr<::tensorpipe::Pipe>& pipe,
                      std::shared_ptr<OutgoingFrame> frame)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status register_transports_and_channels(std::vector<std::string>& urls);
  // A tether tcp transport (internal/tcp_transport.h) for this agent.
  std::shared_ptr<::tensorpipe::transport::Context> make_tcp_transport() const;
  absl::Status exchange_addresses(
      const std::map<std::string, std::string>& mine);
  // The url to reach a peer that published `theirs` (encode_addresses),
  // "" if it shares no transport with this worker.
  std::string url_to(const std::string& theirs) const;

  const WorkerInfo self_;
  const std::vector<WorkerInfo> workers_;
  const std::shared_ptr<c10d::Store> store_;
  const Settings settings_;
  const MessageLimits limits_;
  const std::optional<auth::Authenticator> auth_;
  // A dynamic group (AgentSetup::dynamic): peers come and go, and a worker
  // not known yet may connect (to say it joined).
  const bool dynamic_;
  // The peers and the url a pipe to each connects to ("" if we share no
  // transport).
  common::PeerTable peers_;
  // This worker's listener addresses, by transport (set by init(), then
  // const).
  std::map<std::string, std::string> my_addresses_;
  // Bound of a liveness probe in join() (AgentSetup::peer_timeout).
  const absl::Duration peer_timeout_;
  join::StoreJoin joiner_;
  Incoming incoming_;
  common::ShutdownSequence shutdown_sequence_;

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<int, std::shared_ptr<ClientPipe>> client_pipes_
      ABSL_GUARDED_BY(mu_);
  PendingRequests::Connection next_connection_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_set<std::shared_ptr<::tensorpipe::Pipe>> server_pipes_
      ABSL_GUARDED_BY(mu_);
  // Server pipes still authenticating.
  absl::flat_hash_map<const ::tensorpipe::Pipe*, ServerAuth> server_auth_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<::tensorpipe::Context> context_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<::tensorpipe::Listener> listener_ ABSL_GUARDED_BY(mu_);
  // The urls listener_ listens on, with the addresses peers know (set by
  // init(), then const).
  std::vector<std::string> listening_urls_;
  std::unique_ptr<SerialExecutor> io_ ABSL_GUARDED_BY(mu_);
  // Requests posted to the io thread and not yet written (or queued on
  // their pipe); direct writes of requests wait until there are none.
  int64_t queued_io_writes_ ABSL_GUARDED_BY(mu_) = 0;
  // Threads inside write_directly().
  int direct_writes_ ABSL_GUARDED_BY(mu_) = 0;
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

std::shared_ptr<::tensorpipe::transport::Context> State::make_tcp_transport()
    const {
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
      kControlBytesPerStorage * static_cast<size_t>(std::max<int64_t>(
                                    0, limits_.max_storages));
  options.handshake_timeout = settings_.handshake_timeout;
  options.log_prefix =
      absl::StrCat("tensorpipe agent of worker '", self_.name, "'");
  return internal::create_tcp_transport(std::move(options));
}

std::string State::url_to(const std::string& published) const {
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

absl::Status State::exchange_addresses(
    const std::map<std::string, std::string>& mine) {
  my_addresses_ = mine;
  const std::string who =
      absl::StrCat("tensorpipe agent of worker '", self_.name, "'");
  if (dynamic_) {
    return common::publish_and_look_up(
        *store_, kAddressKeyPrefix, self_, workers_, encode_addresses(mine),
        peers_,
        [this](const std::string& published) -> absl::StatusOr<std::string> {
          return url_to(published);
        },
        who);
  }
  absl::StatusOr<std::vector<std::string>> addresses =
      common::exchange_addresses(*store_, kAddressKeyPrefix, self_.id,
                                 static_cast<int>(workers_.size()),
                                 encode_addresses(mine),
                                 settings_.init_timeout, who);
  if (!addresses.ok()) return addresses.status();
  for (size_t rank = 0; rank < addresses->size(); ++rank) {
    peers_.set_address(static_cast<int>(rank), url_to((*addresses)[rank]));
  }
  return absl::OkStatus();
}

absl::Status State::add_peer(const WorkerInfo& worker) {
  return common::add_peer(
      *store_, kAddressKeyPrefix, dynamic_, worker, peers_,
      [this](const std::string& published) -> absl::StatusOr<std::string> {
        return url_to(published);
      },
      absl::StrCat("tensorpipe agent of worker '", self_.name, "'"));
}

void State::remove_peer(const WorkerInfo& worker) {
  if (!peers_.remove(worker)) return;
  // Its pipe goes, so that a worker joining later with its rank gets one of
  // its own. Nothing is in flight on it (the Worker drained it first).
  std::shared_ptr<ClientPipe> client;
  {
    absl::MutexLock lock(&mu_);
    auto it = client_pipes_.find(worker.id);
    if (it == client_pipes_.end()) return;
    client = std::move(it->second);
    client_pipes_.erase(it);
  }
  client->pipe->close();
}

absl::Status State::init() {
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
  absl::StatusOr<std::vector<Incoming::Deferred>> deferred =
      incoming_.start(std::move(handler),
                      [weak = weak_from_this()](
                          const std::weak_ptr<::tensorpipe::Pipe>& pipe,
                          int64_t id, const absl::StatusOr<Message>& result) {
                        if (std::shared_ptr<State> state = weak.lock()) {
                          state->send_response(pipe, id, result);
                        }
                      });
  if (!deferred.ok()) return deferred.status();
  for (Incoming::Deferred& entry : *deferred) {
    auto shared = std::make_shared<Incoming::Deferred>(std::move(entry));
    post_io([shared](State& state) {
      state.incoming_.run_deferred(std::move(*shared));
    });
  }
  return absl::OkStatus();
}

bool State::post_io(std::function<void(State&)> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  return io_->post([weak = weak_from_this(), task = std::move(task)] {
    std::shared_ptr<State> state = weak.lock();
    if (state == nullptr) return;
    ScopedMark mark(t_io_task_of, state.get());
    task(*state);
  });
}

// ------------------------------------------------------------- client side

Future<Message> State::send(const WorkerInfo& to, Message request,
                            absl::Duration timeout) {
  std::optional<common::Peer> peer = peers_.by_name(to.name);
  absl::StatusOr<PendingRequests::Request> pending;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return Future<Message>::ready(
          common::sent_after_shutdown(self_.name, request.type, to.name));
    }
    if (!peer.has_value()) {
      return Future<Message>::ready(absl::UnavailableError(
          absl::StrCat("worker '", to.name, "' is not in the group of worker '",
                       self_.name, "'")));
    }
    if (peer->address.empty()) {
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
  const int rank = peer->info.id;
  if (in_tp_callback()) {
    write_request(rank, id, std::move(frame));
  } else if (!write_request_directly(rank, id, frame)) {
    // Refused only once shut down, which has failed the request already.
    post_io([rank, id, frame = std::move(frame)](State& state) mutable {
      state.write_request(rank, id, std::move(frame));
      absl::MutexLock lock(&state.mu_);
      --state.queued_io_writes_;
    });
  }
  return std::move(pending->response);
}

bool State::write_directly(const std::function<void()>& write) {
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

bool State::write_request_directly(int rank, int64_t id,
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
    if (!pending_.set_connection(id, it->second->connection)) {
      return true;  // timed out before it left
    }
    client = it->second;
  }
  write_directly([this, &client, &frame] {
    write_on_client(client, std::move(frame));
  });
  return true;
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
      if (!client->ready) {
        client->queued.emplace_back(id, std::move(frame));
        return;
      }
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
    std::optional<common::Peer> peer = peers_.by_rank(rank);
    if (!peer.has_value()) {
      pending_.complete(id, absl::UnavailableError(absl::StrCat(
                                "worker of rank ", rank,
                                " has left the group of worker '", self_.name,
                                "'")));
      return;
    }
    std::shared_ptr<::tensorpipe::Pipe> pipe;
    try {
      pipe = context->connect(
          peer->address,
          ::tensorpipe::PipeOptions().remoteName(peer->info.name));
    } catch (const std::exception& e) {
      pending_.complete(
          id, absl::UnavailableError(absl::StrCat(
                  "cannot connect to worker '", peer->info.name, "' at ",
                  peer->address, ": ", e.what())));
      return;
    }
    bool inserted = false;
    bool still_pending = false;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        auto [it, added] = client_pipes_.emplace(rank, nullptr);
        if (added) {
          it->second = std::make_shared<ClientPipe>(
              rank, pipe, next_connection_++, auth_.has_value());
          if (auth_) it->second->own_challenge = auth_->challenge();
        }
        inserted = added;
        client = it->second;
        still_pending = pending_.set_connection(id, client->connection);
      }
    }
    if (!inserted) pipe->close();
    if (client == nullptr) return;  // shut down meanwhile
    if (inserted) {
      read_responses(client);
      if (auth_) {
        // Our challenge goes first; the requests wait for the server's.
        std::string challenge;
        {
          absl::MutexLock lock(&mu_);
          challenge = client->own_challenge;
        }
        write_on_client(client, internal::make_auth_frame(
                                    {internal::AuthStep::kHello, self_.name,
                                     std::move(challenge)}));
      }
    }
    if (!still_pending) return;
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

void State::write_on_client(const std::shared_ptr<ClientPipe>& client,
                            std::shared_ptr<OutgoingFrame> frame) {
  ::tensorpipe::Message message = frame->to_tensorpipe();
  client->pipe->write(std::move(message),
                      [weak = weak_from_this(), client,
                       frame](const ::tensorpipe::Error& error) {
                        if (!error) return;
                        on_callback(weak, [client, error](State& state) {
                          state.on_client_pipe_error(client, error);
                        });
                      });
}

void State::on_client_auth(const std::shared_ptr<ClientPipe>& client,
                           const internal::AuthFrame& auth) {
  const std::string peer = peers_.name_of(client->rank);
  auto fail = [&](const std::string& why) {
    on_client_pipe_error(client, why, absl::StatusCode::kUnauthenticated);
  };
  switch (auth.step) {
    case internal::AuthStep::kRefused:
      fail(absl::StrCat("worker '", peer, "' refused the connection: ",
                        auth.data));
      return;
    case internal::AuthStep::kHello: {
      if (!auth_) {
        fail(absl::StrCat(
            "worker '", peer, "' requires authentication and worker '",
            self_.name, "' has no secret (RpcOptions::auth_secret or ",
            auth::kSecretEnv, ")"));
        return;
      }
      if (auth.name != peer) {
        fail(absl::StrCat("the server at worker '", peer,
                          "' says it is '", auth.name, "'"));
        return;
      }
      std::vector<std::pair<int64_t, std::shared_ptr<OutgoingFrame>>> queued;
      std::string own;
      {
        absl::MutexLock lock(&mu_);
        if (client->ready) {
          fail(absl::StrCat("worker '", peer, "' sent a second challenge"));
          return;
        }
        client->server_challenge = auth.data;
        own = client->own_challenge;
      }
      write_on_client(
          client, internal::make_auth_frame(
                      {internal::AuthStep::kProof, self_.name,
                       auth_->prove(auth::Role::kClient, self_.name, peer,
                                    auth.data, own)}));
      // `ready` only once nothing is queued: a direct write (which needs
      // it) never overtakes a queued request.
      while (true) {
        {
          absl::MutexLock lock(&mu_);
          if (client->queued.empty()) {
            client->ready = true;
            break;
          }
          queued.clear();
          queued.swap(client->queued);
        }
        for (auto& [id, frame] : queued) {
          write_on_client(client, std::move(frame));
        }
      }
      return;
    }
    case internal::AuthStep::kProof: {
      std::string own, theirs;
      {
        absl::MutexLock lock(&mu_);
        own = client->own_challenge;
        theirs = client->server_challenge;
      }
      if (!auth_ || theirs.empty() ||
          !auth_->verify(auth.data, auth::Role::kServer, peer, self_.name, own,
                         theirs)) {
        fail(absl::StrCat("worker '", peer,
                          "' failed to authenticate (a different secret?)"));
        return;
      }
      absl::MutexLock lock(&mu_);
      client->server_verified = true;
      return;
    }
  }
}

void State::read_responses(std::shared_ptr<ClientPipe> client) {
  std::shared_ptr<::tensorpipe::Pipe> pipe = client->pipe;
  pipe->readDescriptor([weak = weak_from_this(), client = std::move(client)](
                           const ::tensorpipe::Error& error,
                           ::tensorpipe::Descriptor descriptor) {
    on_callback(weak, [client, error,
                       descriptor = std::move(descriptor)](State& state) {
      state.on_response_descriptor(client, error, descriptor);
    });
  });
}

void State::on_response_descriptor(const std::shared_ptr<ClientPipe>& client,
                                   const ::tensorpipe::Error& error,
                                   const ::tensorpipe::Descriptor& descriptor) {
  if (error) {
    on_client_pipe_error(client, error);
    return;
  }
  absl::StatusOr<std::unique_ptr<IncomingFrame>> allocated =
      internal::allocate_frame(descriptor, limits_);
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
        on_callback(weak, [client, frame, error](State& state) {
          state.on_response(client, frame, error);
        });
      });
}

void State::on_response(const std::shared_ptr<ClientPipe>& client,
                        const std::shared_ptr<IncomingFrame>& frame,
                        const ::tensorpipe::Error& error) {
  if (error) {
    on_client_pipe_error(client, error);
    return;
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
    verified = client->server_verified;
  }
  if (!verified) {
    on_client_pipe_error(client, "a response before the server authenticated",
                         absl::StatusCode::kUnauthenticated);
    return;
  }
  read_responses(client);
  absl::StatusOr<Message> result = frame->take_result();
  if (!frame->refused.ok()) {
    // Over this worker's limits: read and dropped; the pipe goes on.
    result = absl::Status(
        frame->refused.code(),
        absl::StrCat("worker '", self_.name, "' refuses the response of '",
                     peers_.name_of(client->rank), "': ",
                     frame->refused.message()));
  }
  // A response for an id no longer pending (timed out) is dropped.
  pending_.complete(frame->header.id, std::move(result));
}

void State::on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                                 absl::string_view what,
                                 absl::StatusCode code) {
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
      absl::Status(code, absl::StrCat(code == absl::StatusCode::kUnauthenticated
                                          ? "worker '"
                                          : "lost the connection from worker '",
                                      self_.name,
                                      code == absl::StatusCode::kUnauthenticated
                                          ? "' may not connect to worker '"
                                          : "' to worker '",
                                      peers_.name_of(client->rank), "' (rank ",
                                      client->rank, "): ", what)));
}

void State::on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                                 const ::tensorpipe::Error& error) {
  if (std::shared_ptr<internal::RefusedError> refused =
          error.castToType<internal::RefusedError>()) {
    on_client_pipe_error(client, refused->what(),
                         absl::StatusCode::kUnauthenticated);
    return;
  }
  on_client_pipe_error(client, error.what());
}

// ------------------------------------------------------------- server side

void State::accept_next(std::shared_ptr<::tensorpipe::Listener> listener) {
  ::tensorpipe::Listener& target = *listener;
  target.accept([weak = weak_from_this(), listener = std::move(listener)](
                    const ::tensorpipe::Error& error,
                    std::shared_ptr<::tensorpipe::Pipe> pipe) {
    on_callback(weak, [listener, error, pipe = std::move(pipe)](State& state) {
      state.on_accept(listener, error, pipe);
    });
  });
}

void State::on_accept(const std::shared_ptr<::tensorpipe::Listener>& listener,
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
      ServerAuth& auth = server_auth_[pipe.get()];
      auth.own_challenge = auth_->challenge();
      hello = internal::make_auth_frame(
          {internal::AuthStep::kHello, self_.name, auth.own_challenge});
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
    on_callback(weak, [pipe, error,
                       descriptor = std::move(descriptor)](State& state) {
      state.on_request_descriptor(pipe, error, descriptor);
    });
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
      internal::allocate_frame(descriptor, limits_);
  if (allocated.ok() && (*allocated)->header.kind != FrameKind::kRequest &&
      (*allocated)->header.kind != FrameKind::kAuth) {
    allocated = absl::InvalidArgumentError("a response on a server pipe");
  }
  if (!allocated.ok()) {
    // Broken or beyond any limit: the pipe is unusable from here on. (A
    // message merely over this worker's limits is refused alone, below.)
    LOG(WARNING) << "tensorpipe agent of worker '" << self_.name
                 << "' drops a connection from '" << pipe->getRemoteName()
                 << "': " << allocated.status().ToString();
    drop_server_pipe(pipe);
    return;
  }
  std::shared_ptr<IncomingFrame> frame = *std::move(allocated);
  pipe->read(frame->allocation, [weak = weak_from_this(), pipe,
                                 frame](const ::tensorpipe::Error& error) {
    on_callback(weak, [pipe, frame, error](State& state) {
      if (error) {
        state.drop_server_pipe(pipe);
        return;
      }
      if (!state.on_server_auth(pipe, *frame)) return;
      if (frame->header.kind == FrameKind::kAuth) {
        state.read_requests(pipe);  // the handshake goes on
        return;
      }
      state.read_requests(pipe);
      if (!frame->refused.ok()) {
        // Over this worker's limits: its bytes were read and dropped; the
        // sender learns why, and the pipe serves on.
        std::shared_ptr<OutgoingFrame> answer = internal::make_response_frame(
            frame->header.id,
            absl::Status(frame->refused.code(),
                         absl::StrCat("worker '", state.self_.name,
                                      "' refuses a ",
                                      message_type_name(frame->header.type),
                                      ": ", frame->refused.message())));
        pipe->write(answer->to_tensorpipe(),
                    [answer](const ::tensorpipe::Error& /*error*/) {});
        return;
      }
      absl::StatusOr<Message> request = frame->take_result();
      state.incoming_.arrived(pipe, *std::move(request));
    });
  });
}

void State::drop_server_pipe(const std::shared_ptr<::tensorpipe::Pipe>& pipe) {
  {
    absl::MutexLock lock(&mu_);
    server_pipes_.erase(pipe);
    server_auth_.erase(pipe.get());
  }
  pipe->close();
}

bool State::on_server_auth(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                           IncomingFrame& frame) {
  const bool is_auth = frame.header.kind == FrameKind::kAuth;
  absl::StatusOr<internal::AuthFrame> auth =
      is_auth ? frame.take_auth() : absl::StatusOr<internal::AuthFrame>();
  ServerAuth state;
  bool authenticating = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = server_auth_.find(pipe.get());
    if (it != server_auth_.end()) {
      authenticating = true;
      state = it->second;
    }
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
    refuse(pipe, "?", absl::StrCat("worker '", self_.name,
                                   "' requires authentication and the peer "
                                   "sent a request without it"));
    return false;
  }
  if (!auth.ok()) {
    refuse(pipe, "?", auth.status().message());
    return false;
  }
  if (state.stage == ServerAuth::Stage::kAwaitHello &&
      auth->step == internal::AuthStep::kHello) {
    // A dynamic group's joiner connects before the members know it.
    if (!dynamic_ && !peers_.by_name(auth->name).has_value()) {
      refuse(pipe, auth->name, "not a worker of this group");
      return false;
    }
    std::shared_ptr<OutgoingFrame> proof = internal::make_auth_frame(
        {internal::AuthStep::kProof, self_.name,
         auth_->prove(auth::Role::kServer, self_.name, auth->name, auth->data,
                      state.own_challenge)});
    {
      absl::MutexLock lock(&mu_);
      auto it = server_auth_.find(pipe.get());
      if (it == server_auth_.end()) return false;
      it->second.stage = ServerAuth::Stage::kAwaitProof;
      it->second.peer = auth->name;
      it->second.peer_challenge = auth->data;
    }
    pipe->write(proof->to_tensorpipe(),
                [proof](const ::tensorpipe::Error& /*error*/) {});
    return true;
  }
  if (state.stage == ServerAuth::Stage::kAwaitProof &&
      auth->step == internal::AuthStep::kProof) {
    if (!auth_->verify(auth->data, auth::Role::kClient, state.peer,
                       self_.name, state.own_challenge,
                       state.peer_challenge)) {
      refuse(pipe, state.peer, "authentication failed (a different secret?)");
      return false;
    }
    absl::MutexLock lock(&mu_);
    server_auth_.erase(pipe.get());
    return true;
  }
  refuse(pipe, state.peer, "an unexpected authentication step");
  return false;
}

void State::refuse(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                   absl::string_view peer, absl::string_view why) {
  LOG(WARNING) << "tensorpipe agent of worker '" << self_.name
               << "' refused a connection from '" << peer << "': " << why;
  {
    absl::MutexLock lock(&mu_);
    server_pipes_.erase(pipe);
    server_auth_.erase(pipe.get());
  }
  std::shared_ptr<OutgoingFrame> refusal = internal::make_auth_frame(
      {internal::AuthStep::kRefused, self_.name, std::string(why)});
  pipe->write(refusal->to_tensorpipe(),
              [pipe, refusal](const ::tensorpipe::Error& /*error*/) {
                pipe->close();
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
  // Refused only once shut down: then nobody waits for the answer.
  write_directly([this, &pipe, &frame] { write_response(pipe, frame); });
}

void State::write_response(const std::weak_ptr<::tensorpipe::Pipe>& weak_pipe,
                           std::shared_ptr<OutgoingFrame> frame) {
  std::shared_ptr<::tensorpipe::Pipe> pipe = weak_pipe.lock();
  if (pipe == nullptr) {
    // The pipe broke; the sender has failed the request already.
    incoming_.answered();
    return;
  }
  ::tensorpipe::Message message = frame->to_tensorpipe();
  pipe->write(std::move(message), [weak = weak_from_this(), frame](
                                      const ::tensorpipe::Error& /*error*/) {
    // On error the pipe is broken: its read loop notices and drops it.
    // Counted here even inside a direct write (answered() only takes its
    // counter's lock): saves waking the io thread once per response.
    if (std::shared_ptr<State> state = weak.lock()) state->incoming_.answered();
  });
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

void State::shutdown() {
  const bool own_thread = t_tp_callback_of == this || t_io_task_of == this ||
                          TimerQueue::running_owner() == this;
  if (!shutdown_sequence_.begin(own_thread)) return;
  auto resources = std::make_shared<Resources>();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
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
      resources->pipes.push_back(client->pipe);
    }
    client_pipes_.clear();
    for (const auto& pipe : server_pipes_) resources->pipes.push_back(pipe);
    server_pipes_.clear();
    resources->context = std::move(context_);
    resources->listener = std::move(listener_);
    resources->io = std::move(io_);
    resources->timers = std::move(timers_);
  }
  // Before the timers go (resources->join()).
  pending_.cancel_all(absl::CancelledError(absl::StrCat(
      "worker '", self_.name, "' shut down with the request pending")));
  // From here on every pending tensorpipe operation fails; our callbacks see
  // closed_ and do nothing.
  resources->close();
  // Handler calls already started finish first.
  incoming_.close();
  // A thread of ours cannot join itself: then another thread finishes.
  // WARNING: it may outlive the agent; it owns everything it touches.
  shutdown_sequence_.finish(own_thread, [resources] {
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
  auto state = std::make_shared<State>(std::move(setup), *std::move(settings));
  absl::Status initialized = state->init();
  if (!initialized.ok()) {
    state->shutdown();
    return initialized;
  }
  return std::make_unique<common::SharedStateAgent<State>>(std::move(state));
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
