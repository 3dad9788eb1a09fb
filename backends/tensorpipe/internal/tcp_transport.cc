#include "backends/tensorpipe/internal/tcp_transport.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <arpa/inet.h>
#include <c10/util/Logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <tensorpipe/common/deferred_executor.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/transport/connection_boilerplate.h>
#include <tensorpipe/transport/connection_impl_boilerplate.h>
#include <tensorpipe/transport/context_boilerplate.h>
#include <tensorpipe/transport/context_impl_boilerplate.h>
#include <tensorpipe/transport/error.h>
#include <tensorpipe/transport/listener_boilerplate.h>
#include <tensorpipe/transport/listener_impl_boilerplate.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/tensorpipe/internal/tcp_handshake.h"

namespace tether::backends::internal {
namespace {

namespace tp = ::tensorpipe;
namespace tpt = ::tensorpipe::transport;

// Reads go through a buffer in chunks of this size; a payload's remainder at
// least this large is read straight into its destination.
constexpr size_t kChunk = 64 << 10;
// Bytes read ahead while TensorPipe has no read pending.
constexpr size_t kReadAhead = 256 << 10;
// Frames of one write call gathered into one sendmsg().
constexpr size_t kMaxIov = 64;
// Refusals logged per window; the rest are counted in the next line.
constexpr int kLogBurst = 10;
constexpr auto kLogWindow = std::chrono::seconds(10);

// The error of a connection that broke tether's rules (malformed bytes, a
// frame over a limit, a handshake that did not finish in time).
class TcpError final : public tp::BaseError {
 public:
  explicit TcpError(std::string what) : what_(std::move(what)) {}
  std::string what() const override { return what_; }

 private:
  std::string what_;
};

// A tensorpipe::Error of type T, saying where it arose (TP_CREATE_ERROR
// only works inside namespace tensorpipe).
#define TCP_TRANSPORT_ERROR(T, ...)                                         \
  ::tensorpipe::Error(std::make_shared<T>(__VA_ARGS__), "tcp_transport.cc", \
                      __LINE__)

tp::Error refused_error(std::string reason) {
  return TCP_TRANSPORT_ERROR(RefusedError, std::move(reason));
}

tp::Error tcp_error(std::string what) {
  return TCP_TRANSPORT_ERROR(TcpError, std::move(what));
}

}  // namespace

bool parse_socket_address(const std::string& text, sockaddr_storage* storage,
                   socklen_t* length) {
  std::string host = text;
  std::string port_text;
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    std::string rest = host.substr(close + 1);
    host = host.substr(1, close - 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return false;
      port_text = rest.substr(1);
    }
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    port_text = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  int port = 0;
  if (!port_text.empty() &&
      (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535)) {
    return false;
  }
  *storage = sockaddr_storage{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in);
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

namespace {

std::string format_address(const sockaddr_storage& storage) {
  char host[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(storage);
    inet_ntop(AF_INET, &v4.sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(v4.sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(storage);
    inet_ntop(AF_INET6, &v6.sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(v6.sin6_port));
  }
  return "?";
}

class ContextImpl;
class ListenerImpl;
class ConnectionImpl;

// What the loop calls when a watched descriptor is ready.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void on_events(uint32_t events) = 0;
};

// ------------------------------------------------------------------ context

// The context owns the loop: one thread that waits in epoll_wait on the
// watched sockets, an eventfd for deferred functions and the next timer.
class ContextImpl final
    : public tpt::ContextImplBoilerplate<ContextImpl, ListenerImpl,
                                         ConnectionImpl>,
      public tp::EventLoopDeferredExecutor {
 public:
  static std::shared_ptr<ContextImpl> create(TcpTransportOptions options) {
    const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd < 0) return nullptr;
    const int event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (event_fd < 0) {
      ::close(epoll_fd);
      return nullptr;
    }
    return std::make_shared<ContextImpl>(std::move(options), epoll_fd,
                                         event_fd);
  }

  ContextImpl(TcpTransportOptions options, int epoll_fd, int event_fd)
      : ContextImplBoilerplate(kTcpDomainDescriptor),
        options_(std::move(options)),
        epoll_fd_(epoll_fd),
        event_fd_(event_fd) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = 0;  // record 0: the eventfd
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &event);
    startThread("tether-tcp");
  }

  ~ContextImpl() override {
    ::close(event_fd_);
    ::close(epoll_fd_);
  }

  const TcpTransportOptions& options() const { return options_; }

  // Loop thread only: calls `handler` for `events` on `fd` (replacing what
  // was watched on it), until unwatch(fd).
  void watch(int fd, uint32_t events, std::shared_ptr<Handler> handler) {
    const uint64_t record = next_record_++;
    epoll_event event{};
    event.events = events;
    event.data.u64 = record;
    auto it = records_.find(fd);
    if (it != records_.end()) {
      handlers_.erase(it->second);
      it->second = record;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &event);
    } else {
      records_[fd] = record;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
    }
    handlers_[record] = std::move(handler);
  }

  void unwatch(int fd) {
    auto it = records_.find(fd);
    if (it == records_.end()) return;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    handlers_.erase(it->second);
    records_.erase(it);
  }

  // Loop thread only: runs `fn` on the loop after `delay`.
  void after(absl::Duration delay, std::function<void()> fn) {
    timers_.emplace(std::chrono::steady_clock::now() +
                        absl::ToChronoNanoseconds(delay),
                    std::move(fn));
  }

  // Loop thread only: whether a refusal may be logged now (at most
  // kLogBurst per window); `*suppressed` is how many were not since.
  bool may_log(int* suppressed) {
    const auto now = std::chrono::steady_clock::now();
    if (now - log_window_start_ > kLogWindow) {
      log_window_start_ = now;
      logged_in_window_ = 0;
    }
    if (logged_in_window_ >= kLogBurst) {
      ++suppressed_;
      return false;
    }
    ++logged_in_window_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 protected:
  void handleErrorImpl() override {}

  void joinImpl() override {
    stopping_ = true;
    wake();
    joinThread();
    timers_.clear();
  }

  void eventLoop() override {
    std::vector<epoll_event> events(64);
    for (;;) {
      int timeout_ms = -1;
      if (!timers_.empty()) {
        const auto wait = timers_.begin()->first -
                          std::chrono::steady_clock::now();
        timeout_ms = static_cast<int>(std::max<int64_t>(
            0, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
      }
      const int n = ::epoll_wait(epoll_fd_, events.data(),
                                 static_cast<int>(events.size()), timeout_ms);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == 0) {
          uint64_t count = 0;
          while (::read(event_fd_, &count, sizeof(count)) > 0) {
          }
          runDeferredFunctionsFromEventLoop();
          continue;
        }
        // A record replaced or removed earlier in this batch is stale.
        auto it = handlers_.find(events[i].data.u64);
        if (it == handlers_.end()) continue;
        std::shared_ptr<Handler> handler = it->second;
        handler->on_events(events[i].events);
      }
      run_due_timers();
      if (stopping_ && handlers_.empty()) return;
    }
  }

  void wakeupEventLoopToDeferFunction() override { wake(); }

 private:
  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
  }

  void run_due_timers() {
    const auto now = std::chrono::steady_clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      std::function<void()> fn = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
      fn();
    }
  }

  const TcpTransportOptions options_;
  const int epoll_fd_;
  const int event_fd_;
  std::atomic<bool> stopping_{false};
  // Loop thread only.
  uint64_t next_record_ = 1;
  std::unordered_map<int, uint64_t> records_;
  std::unordered_map<uint64_t, std::shared_ptr<Handler>> handlers_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>>
      timers_;
  std::chrono::steady_clock::time_point log_window_start_{};
  int logged_in_window_ = 0;
  int suppressed_ = 0;
};

// --------------------------------------------------------------- connection

class ConnectionImpl final
    : public tpt::ConnectionImplBoilerplate<ContextImpl, ListenerImpl,
                                            ConnectionImpl>,
      public Handler {
 public:
  // Accepted by `listener` (its key for this connection: `key`).
  ConnectionImpl(ConstructorToken token, std::shared_ptr<ContextImpl> context,
                 std::string id, int fd, std::string peer,
                 std::weak_ptr<ListenerImpl> listener, uint64_t key)
      : ConnectionImplBoilerplate(token, std::move(context), std::move(id)),
        server_(true),
        fd_(fd),
        peer_(std::move(peer)),
        listener_(std::move(listener)),
        key_(key) {}

  // Connecting to `addr`.
  ConnectionImpl(ConstructorToken token, std::shared_ptr<ContextImpl> context,
                 std::string id, std::string addr)
      : ConnectionImplBoilerplate(token, std::move(context), std::move(id)),
        server_(false),
        peer_(std::move(addr)) {}

  ~ConnectionImpl() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void on_events(uint32_t events) override;

 protected:
  void initImplFromLoop() override;
  void readImplFromLoop(read_callback_fn fn) override;
  void readImplFromLoop(tp::AbstractNopHolder& object,
                        read_nop_callback_fn fn) override;
  void readImplFromLoop(void* ptr, size_t length,
                        read_callback_fn fn) override;
  void writeImplFromLoop(const void* ptr, size_t length,
                         write_callback_fn fn) override;
  void handleErrorImpl() override;

 private:
  enum class State { kConnecting, kHandshake, kRefusing, kEstablished };
  enum class Step { kAwaitHello, kAwaitProof, kAwaitVerdict };
  enum class Fill { kData, kAgain, kClosed };

  struct ReadOp {
    read_callback_fn fn;
    char* ptr = nullptr;
    size_t length = 0;
    bool given = false;  // the caller gave ptr and length
    std::unique_ptr<char[]> owned;
    bool have_length = false;
    size_t done = 0;
  };
  struct WriteOp {
    uint64_t header = 0;
    const char* ptr = nullptr;
    size_t done = 0;  // of the header's 8 bytes and then the payload
    write_callback_fn fn;
  };

  // Handshake.
  void start_client_handshake();
  void on_handshake_input();
  void on_frame(const HandshakeFrame& frame);
  void on_server_frame(const HandshakeFrame& frame);
  void on_client_frame(const HandshakeFrame& frame);
  // Why `name` may not take part, or "" if it may.
  std::string check_member(const std::string& name) const;
  void send_frame(const HandshakeFrame& frame);
  // Server: tells the peer `reason`, logs it, and waits for the peer to
  // close (bounded by the handshake deadline).
  void refuse(const std::string& reason);
  // Logs (rate limited) and fails the connection with `error`.
  void fail(tp::Error error, const std::string& why, bool log);
  void established();
  void on_handshake_timeout();
  void notify_listener(bool ok);

  // Data.
  void process_reads();
  void process_writes();
  // Reads at most `most` bytes into the buffer. kClosed: the peer closed
  // or the socket failed; why is in fill_error_ (not yet set on the
  // connection).
  Fill fill(size_t most);
  // fill(), failing the connection on kClosed; true if bytes came.
  bool fill_or_fail(size_t most);
  void update_interest();

  absl::string_view buffered() const {
    return absl::string_view(in_.data() + in_begin_, in_end_ - in_begin_);
  }
  void consume(size_t n) {
    in_begin_ += n;
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  }
  std::string describe_peer() const {
    return peer_name_.empty() ? peer_
                              : absl::StrCat("'", peer_name_, "' (", peer_,
                                             ")");
  }

  const bool server_;
  int fd_ = -1;
  const std::string peer_;  // the peer's address
  const std::weak_ptr<ListenerImpl> listener_;
  const uint64_t key_ = 0;

  State state_ = State::kConnecting;
  Step step_ = Step::kAwaitHello;
  uint32_t interest_ = 0;
  bool listener_notified_ = false;
  std::string peer_name_;
  std::string own_challenge_;
  std::string peer_challenge_;
  std::string refusal_;
  tp::Error fill_error_;

  std::vector<char> in_;
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  std::string handshake_out_;
  size_t handshake_sent_ = 0;

  std::deque<ReadOp> reads_;
  std::deque<WriteOp> writes_;
};

// ----------------------------------------------------------------- listener

class ListenerImpl final
    : public tpt::ListenerImplBoilerplate<ContextImpl, ListenerImpl,
                                          ConnectionImpl>,
      public Handler {
 public:
  ListenerImpl(ConstructorToken token, std::shared_ptr<ContextImpl> context,
               std::string id, std::string addr)
      : ListenerImplBoilerplate(token, std::move(context), std::move(id)),
        requested_(std::move(addr)) {}

  ~ListenerImpl() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void on_events(uint32_t events) override;

  // Loop thread: the handshake of connection `key` ended.
  void handshake_done(uint64_t key, bool ok);

 protected:
  void initImplFromLoop() override;
  void acceptImplFromLoop(accept_callback_fn fn) override;
  std::string addrImplFromLoop() const override { return address_; }
  void handleErrorImpl() override;

 private:
  void deliver();

  const std::string requested_;
  std::string address_;
  int fd_ = -1;
  bool paused_ = false;
  uint64_t next_key_ = 1;
  std::deque<accept_callback_fn> fns_;
  std::deque<std::shared_ptr<tpt::Connection>> ready_;
  std::unordered_map<uint64_t, std::shared_ptr<tpt::Connection>> handshaking_;
};

void ListenerImpl::initImplFromLoop() {
  context_->enroll(*this);
  sockaddr_storage storage;
  socklen_t length = 0;
  if (!parse_socket_address(requested_, &storage, &length)) {
    setError(tcp_error(absl::StrCat("cannot listen on '", requested_,
                                    "': not an IP address (and port)")));
    return;
  }
  fd_ = ::socket(storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                 0);
  if (fd_ < 0) {
    setError(TCP_TRANSPORT_ERROR(tp::SystemError, "socket", errno));
    return;
  }
  const int on = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    setError(TCP_TRANSPORT_ERROR(tp::SystemError, "bind", errno));
    return;
  }
  if (::listen(fd_, 128) != 0) {
    setError(TCP_TRANSPORT_ERROR(tp::SystemError, "listen", errno));
    return;
  }
  sockaddr_storage bound{};
  socklen_t bound_length = sizeof(bound);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &bound_length);
  address_ = format_address(bound);
  // Connections are accepted (and handshake) whether or not TensorPipe has
  // asked for one yet.
  context_->watch(fd_, EPOLLIN, shared_from_this());
}

void ListenerImpl::on_events(uint32_t events) {
  if (events & EPOLLERR) {
    int error = 0;
    socklen_t size = sizeof(error);
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &size);
    setError(TCP_TRANSPORT_ERROR(tp::SystemError, "listening socket", error));
    return;
  }
  for (int i = 0; i < 64 && !error_; ++i) {
    sockaddr_storage from{};
    socklen_t length = sizeof(from);
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Out of descriptors or memory: stop accepting a moment rather than
        // spin on a socket that stays readable.
        int suppressed = 0;
        if (context_->may_log(&suppressed)) {
          LOG(WARNING) << context_->options().log_prefix
                       << ": cannot accept a connection on " << address_
                       << " (" << std::strerror(errno) << "); pausing 100 ms";
        }
        context_->unwatch(fd_);
        paused_ = true;
        std::weak_ptr<ListenerImpl> weak = shared_from_this();
        context_->after(absl::Milliseconds(100), [weak] {
          std::shared_ptr<ListenerImpl> self = weak.lock();
          if (self == nullptr || self->error_ || !self->paused_) return;
          self->paused_ = false;
          self->context_->watch(self->fd_, EPOLLIN, self);
        });
        return;
      }
      setError(TCP_TRANSPORT_ERROR(tp::SystemError, "accept", errno));
      return;
    }
    if (handshaking_.size() >= kMaxHandshakes) {
      ::close(fd);
      int suppressed = 0;
      if (context_->may_log(&suppressed)) {
        LOG(WARNING) << context_->options().log_prefix
                     << " closed a connection from " << format_address(from)
                     << " at once: " << kMaxHandshakes
                     << " connections are already in their handshake"
                     << (suppressed > 0
                             ? absl::StrCat(" (", suppressed,
                                            " more refusals not logged)")
                             : "");
      }
      continue;
    }
    const uint64_t key = next_key_++;
    handshaking_[key] = createAndInitConnection(
        fd, format_address(from), std::weak_ptr<ListenerImpl>(shared_from_this()),
        key);
  }
}

void ListenerImpl::handshake_done(uint64_t key, bool ok) {
  auto it = handshaking_.find(key);
  if (it == handshaking_.end()) return;
  std::shared_ptr<tpt::Connection> connection = std::move(it->second);
  handshaking_.erase(it);
  if (!ok || error_) return;  // dropping it closes it
  ready_.push_back(std::move(connection));
  deliver();
}

void ListenerImpl::acceptImplFromLoop(accept_callback_fn fn) {
  fns_.push_back(std::move(fn));
  deliver();
}

void ListenerImpl::deliver() {
  while (!fns_.empty() && !ready_.empty() && !error_) {
    accept_callback_fn fn = std::move(fns_.front());
    fns_.pop_front();
    std::shared_ptr<tpt::Connection> connection = std::move(ready_.front());
    ready_.pop_front();
    fn(tp::Error::kSuccess, std::move(connection));
  }
}

void ListenerImpl::handleErrorImpl() {
  if (fd_ >= 0) {
    context_->unwatch(fd_);
    ::close(fd_);
    fd_ = -1;
  }
  for (accept_callback_fn& fn : fns_) fn(error_, nullptr);
  fns_.clear();
  // Dropping them closes them.
  ready_.clear();
  handshaking_.clear();
  context_->unenroll(*this);
}

// --------------------------------------------------------------- connection

void ConnectionImpl::initImplFromLoop() {
  context_->enroll(*this);
  const int on = 1;
  if (!server_) {
    sockaddr_storage storage;
    socklen_t length = 0;
    if (!parse_socket_address(peer_, &storage, &length)) {
      setError(tcp_error(absl::StrCat("cannot connect to '", peer_,
                                      "': not an IP address and port")));
      return;
    }
    fd_ = ::socket(storage.ss_family,
                   SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      setError(TCP_TRANSPORT_ERROR(tp::SystemError, "socket", errno));
      return;
    }
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&storage), length) == 0) {
      start_client_handshake();
    } else if (errno == EINPROGRESS) {
      state_ = State::kConnecting;
    } else {
      setError(TCP_TRANSPORT_ERROR(tp::SystemError, "connect", errno));
      return;
    }
  } else {
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    state_ = State::kHandshake;
    step_ = Step::kAwaitHello;
  }
  std::weak_ptr<ConnectionImpl> weak = shared_from_this();
  context_->after(context_->options().handshake_timeout, [weak] {
    if (std::shared_ptr<ConnectionImpl> self = weak.lock()) {
      self->on_handshake_timeout();
    }
  });
  update_interest();
}

void ConnectionImpl::on_events(uint32_t events) {
  if (error_) return;
  if (state_ == State::kConnecting) {
    int error = 0;
    socklen_t size = sizeof(error);
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &size);
    if (error != 0) {
      setError(TCP_TRANSPORT_ERROR(tp::SystemError, "connect", error));
      return;
    }
    if (events & EPOLLOUT) start_client_handshake();
    if (!error_) update_interest();
    return;
  }
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    if (state_ == State::kEstablished) {
      process_reads();
    } else {
      on_handshake_input();
    }
  }
  if (!error_ && (events & EPOLLOUT)) process_writes();
  if (!error_) update_interest();
}

ConnectionImpl::Fill ConnectionImpl::fill(size_t most) {
  if (in_.size() - in_end_ < most) {
    if (in_begin_ > 0) {
      std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
      in_end_ -= in_begin_;
      in_begin_ = 0;
    }
    if (in_.size() - in_end_ < most) in_.resize(in_end_ + most);
  }
  for (;;) {
    const ssize_t n = ::recv(fd_, in_.data() + in_end_, most, MSG_DONTWAIT);
    if (n > 0) {
      in_end_ += static_cast<size_t>(n);
      return Fill::kData;
    }
    if (n == 0) {
      fill_error_ = TCP_TRANSPORT_ERROR(tp::EOFError);
      return Fill::kClosed;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Fill::kAgain;
    fill_error_ = TCP_TRANSPORT_ERROR(tp::SystemError, "recv", errno);
    return Fill::kClosed;
  }
}

bool ConnectionImpl::fill_or_fail(size_t most) {
  const Fill result = fill(most);
  if (result == Fill::kClosed) setError(fill_error_);
  return result == Fill::kData;
}

void ConnectionImpl::update_interest() {
  if (fd_ < 0 || error_) return;
  uint32_t want = 0;
  const bool output = handshake_sent_ < handshake_out_.size() ||
                      (state_ == State::kEstablished && !writes_.empty());
  switch (state_) {
    case State::kConnecting:
      want = EPOLLOUT;
      break;
    case State::kHandshake:
    case State::kRefusing:
      want = EPOLLIN;
      break;
    case State::kEstablished:
      if (!reads_.empty() || buffered().size() < kReadAhead) want = EPOLLIN;
      break;
  }
  if (output) want |= EPOLLOUT;
  if (want == interest_) return;
  interest_ = want;
  if (want == 0) {
    context_->unwatch(fd_);
  } else {
    context_->watch(fd_, want, shared_from_this());
  }
}

// ------------------------------------------------------------ handshake

void ConnectionImpl::start_client_handshake() {
  state_ = State::kHandshake;
  step_ = Step::kAwaitHello;
  const TcpTransportOptions& options = context_->options();
  HandshakeFrame hello;
  hello.kind = HandshakeKind::kHello;
  hello.has_secret = options.auth.has_value();
  hello.name = options.self;
  if (options.auth) own_challenge_ = options.auth->challenge();
  hello.challenge = own_challenge_;
  send_frame(hello);
}

void ConnectionImpl::send_frame(const HandshakeFrame& frame) {
  handshake_out_ += encode_handshake_frame(frame);
  process_writes();
}

void ConnectionImpl::on_handshake_input() {
  while (!error_ &&
         (state_ == State::kHandshake || state_ == State::kRefusing)) {
    if (state_ == State::kRefusing) {
      // Waiting for the refused peer to close; what it sends is dropped.
      consume(buffered().size());
      const Fill result = fill(4096);
      if (result == Fill::kClosed) {
        // Its close (or reset) ends the refusal: report ours.
        setError(refused_error(refusal_));
        return;
      }
      if (result == Fill::kAgain) return;
      continue;
    }
    absl::StatusOr<std::optional<ParsedHandshakeFrame>> parsed =
        parse_handshake_frame(buffered());
    if (!parsed.ok()) {
      fail(tcp_error(std::string(parsed.status().message())),
           std::string(parsed.status().message()), /*log=*/true);
      return;
    }
    if (!parsed->has_value()) {
      // Never more than one frame's worth buffered.
      const size_t room = kMaxHandshakeFrameBytes + 4 - buffered().size();
      const size_t before = buffered().size();
      const Fill result = fill(room);
      if (result == Fill::kAgain) return;
      if (result == Fill::kClosed) {
        // A peer that goes away in the handshake: a port scan, a peer that
        // gave up, or one that refused us without saying why.
        fail(fill_error_,
             before == 0 ? "closed before the handshake ended"
                         : "closed in the middle of a handshake frame",
             /*log=*/!server_ || before > 0);
        return;
      }
      continue;
    }
    const size_t consumed = (*parsed)->consumed;
    const HandshakeFrame frame = std::move((*parsed)->frame);
    consume(consumed);
    on_frame(frame);
  }
  if (!error_ && state_ == State::kEstablished) {
    process_writes();
    process_reads();
  }
}

std::string ConnectionImpl::check_member(const std::string& name) const {
  const TcpTransportOptions& options = context_->options();
  if (name.empty()) return "a handshake without a worker name";
  if (options.members.empty() ||
      std::find(options.members.begin(), options.members.end(), name) !=
          options.members.end()) {
    return "";
  }
  return absl::StrCat("worker '", options.self, "': '", name,
                      "' is not a worker of this group");
}

void ConnectionImpl::on_frame(const HandshakeFrame& frame) {
  if (frame.version != kHandshakeVersion) {
    const std::string reason = absl::StrCat(
        "worker '", context_->options().self, "' speaks handshake version ",
        kHandshakeVersion, ", the peer ", frame.version);
    if (server_) {
      refuse(reason);
    } else {
      fail(refused_error(reason), reason, /*log=*/true);
    }
    return;
  }
  if (server_) {
    on_server_frame(frame);
  } else {
    on_client_frame(frame);
  }
}

void ConnectionImpl::on_server_frame(const HandshakeFrame& frame) {
  const TcpTransportOptions& options = context_->options();
  if (frame.kind == HandshakeKind::kVerdict && !frame.accepted) {
    fail(refused_error(frame.reason),
         absl::StrCat("the peer refused us: ", frame.reason), /*log=*/true);
    return;
  }
  if (step_ == Step::kAwaitHello && frame.kind == HandshakeKind::kHello) {
    peer_name_ = frame.name;
    if (std::string why = check_member(frame.name); !why.empty()) {
      refuse(why);
      return;
    }
    if (options.auth && !frame.has_secret) {
      refuse(absl::StrCat("worker '", options.self,
                          "' requires authentication and worker '", frame.name,
                          "' has no secret; the group must agree on one"));
      return;
    }
    if (!options.auth && frame.has_secret) {
      refuse(absl::StrCat("worker '", options.self,
                          "' does not authenticate peers (it has no secret); "
                          "the group must agree on one"));
      return;
    }
    if (options.auth && frame.challenge.size() != auth::kChallengeBytes) {
      refuse("a challenge of the wrong size");
      return;
    }
    HandshakeFrame hello;
    hello.kind = HandshakeKind::kHello;
    hello.has_secret = options.auth.has_value();
    hello.name = options.self;
    if (options.auth) {
      own_challenge_ = options.auth->challenge();
      peer_challenge_ = frame.challenge;
      hello.challenge = own_challenge_;
      hello.proof = options.auth->prove(auth::Role::kServer, options.self,
                                        frame.name, frame.challenge,
                                        own_challenge_);
    }
    step_ = Step::kAwaitProof;
    send_frame(hello);
    return;
  }
  if (step_ == Step::kAwaitProof && frame.kind == HandshakeKind::kProof) {
    if (options.auth &&
        !options.auth->verify(frame.proof, auth::Role::kClient, peer_name_,
                              options.self, own_challenge_,
                              peer_challenge_)) {
      refuse(absl::StrCat("worker '", options.self,
                          "' could not authenticate worker '", peer_name_,
                          "' (a different secret?)"));
      return;
    }
    HandshakeFrame verdict;
    verdict.kind = HandshakeKind::kVerdict;
    verdict.accepted = true;
    send_frame(verdict);
    established();
    return;
  }
  fail(tcp_error("an unexpected handshake frame"),
       "an unexpected handshake frame", /*log=*/true);
}

void ConnectionImpl::on_client_frame(const HandshakeFrame& frame) {
  const TcpTransportOptions& options = context_->options();
  if (frame.kind == HandshakeKind::kVerdict && !frame.accepted) {
    fail(refused_error(frame.reason), frame.reason, /*log=*/false);
    return;
  }
  if (step_ == Step::kAwaitHello && frame.kind == HandshakeKind::kHello) {
    peer_name_ = frame.name;
    std::string why = check_member(frame.name);
    if (why.empty() && frame.has_secret != options.auth.has_value()) {
      why = absl::StrCat("worker '", frame.name, "' and worker '",
                         options.self, "' disagree on having a secret");
    }
    if (why.empty() && options.auth &&
        !options.auth->verify(frame.proof, auth::Role::kServer, frame.name,
                              options.self, own_challenge_,
                              frame.challenge)) {
      why = absl::StrCat("worker '", frame.name,
                         "' failed to prove the group's secret to worker '",
                         options.self, "' (a different secret?)");
    }
    if (!why.empty()) {
      HandshakeFrame verdict;
      verdict.kind = HandshakeKind::kVerdict;
      verdict.reason = why;
      send_frame(verdict);
      fail(refused_error(why), why, /*log=*/true);
      return;
    }
    HandshakeFrame proof;
    proof.kind = HandshakeKind::kProof;
    if (options.auth) {
      proof.proof = options.auth->prove(auth::Role::kClient, options.self,
                                        frame.name, frame.challenge,
                                        own_challenge_);
    }
    step_ = Step::kAwaitVerdict;
    send_frame(proof);
    return;
  }
  if (step_ == Step::kAwaitVerdict && frame.kind == HandshakeKind::kVerdict) {
    established();
    return;
  }
  fail(tcp_error("an unexpected handshake frame"),
       "an unexpected handshake frame", /*log=*/true);
}

void ConnectionImpl::refuse(const std::string& reason) {
  int suppressed = 0;
  if (context_->may_log(&suppressed)) {
    LOG(WARNING) << context_->options().log_prefix
                 << " refused a connection from " << describe_peer() << ": "
                 << reason
                 << (suppressed > 0 ? absl::StrCat(" (", suppressed,
                                                   " more not logged)")
                                    : "");
  }
  HandshakeFrame verdict;
  verdict.kind = HandshakeKind::kVerdict;
  verdict.reason = reason;
  refusal_ = reason;
  state_ = State::kRefusing;
  send_frame(verdict);
  if (error_) return;
  // The verdict is small and the socket's buffer empty: it is out unless
  // the peer is gone. Then wait for the peer's close, so the verdict is not
  // lost to a reset.
  if (handshake_sent_ < handshake_out_.size()) {
    setError(refused_error(reason));
    return;
  }
  ::shutdown(fd_, SHUT_WR);
}

void ConnectionImpl::fail(tp::Error error, const std::string& why, bool log) {
  int suppressed = 0;
  if (log && context_->may_log(&suppressed)) {
    LOG(WARNING) << context_->options().log_prefix << " closed a connection "
                 << (server_ ? "from " : "to ") << describe_peer() << ": "
                 << why
                 << (suppressed > 0 ? absl::StrCat(" (", suppressed,
                                                   " more not logged)")
                                    : "");
  }
  setError(std::move(error));
}

void ConnectionImpl::established() {
  state_ = State::kEstablished;
  if (server_) notify_listener(true);
}

void ConnectionImpl::on_handshake_timeout() {
  if (error_ || state_ == State::kEstablished) return;
  if (state_ == State::kRefusing) {
    setError(refused_error(refusal_));
    return;
  }
  const std::string why = absl::StrCat(
      "no handshake within ",
      absl::FormatDuration(context_->options().handshake_timeout));
  fail(tcp_error(why), why, /*log=*/true);
}

void ConnectionImpl::notify_listener(bool ok) {
  if (!server_ || listener_notified_) return;
  listener_notified_ = true;
  // Deferred: the listener may be inside createAndInitConnection() for us.
  context_->deferToLoop([listener = listener_, key = key_, ok] {
    if (std::shared_ptr<ListenerImpl> alive = listener.lock()) {
      alive->handshake_done(key, ok);
    }
  });
}

// ------------------------------------------------------------------ data

void ConnectionImpl::readImplFromLoop(read_callback_fn fn) {
  ReadOp op;
  op.fn = std::move(fn);
  reads_.push_back(std::move(op));
  if (state_ == State::kEstablished) process_reads();
  update_interest();
}

void ConnectionImpl::readImplFromLoop(void* ptr, size_t length,
                                      read_callback_fn fn) {
  ReadOp op;
  op.fn = std::move(fn);
  op.ptr = static_cast<char*>(ptr);
  op.length = length;
  op.given = true;
  reads_.push_back(std::move(op));
  if (state_ == State::kEstablished) process_reads();
  update_interest();
}

void ConnectionImpl::readImplFromLoop(tp::AbstractNopHolder& object,
                                      read_nop_callback_fn fn) {
  // As the boilerplate does, but a message that does not parse fails this
  // connection instead of throwing on the loop thread.
  readImplFromLoop([this, &object, fn = std::move(fn)](
                       const tp::Error& error, const void* ptr, size_t length) {
    if (error) {
      fn(error);
      return;
    }
    tp::NopReader reader(static_cast<const uint8_t*>(ptr), length);
    const nop::Status<void> status = object.read(reader);
    if (status.has_error()) {
      const std::string why = absl::StrCat(
          "a malformed TensorPipe control message (", length,
          " bytes): ", status.GetErrorMessage());
      fail(tcp_error(why), why, /*log=*/true);
      fn(error_);
      return;
    }
    fn(tp::Error::kSuccess);
  });
}

void ConnectionImpl::writeImplFromLoop(const void* ptr, size_t length,
                                       write_callback_fn fn) {
  WriteOp op;
  op.header = length;
  op.ptr = static_cast<const char*>(ptr);
  op.fn = std::move(fn);
  writes_.push_back(std::move(op));
  if (state_ == State::kEstablished) process_writes();
  update_interest();
}

void ConnectionImpl::process_reads() {
  const size_t limit = context_->options().max_unsized_read_bytes;
  while (!error_ && state_ == State::kEstablished) {
    if (reads_.empty()) {
      if (buffered().size() >= kReadAhead) break;
      if (!fill_or_fail(kChunk)) break;
      continue;
    }
    ReadOp& op = reads_.front();
    if (!op.have_length) {
      if (buffered().size() < sizeof(uint64_t)) {
        if (!fill_or_fail(kChunk)) break;
        continue;
      }
      uint64_t length = 0;
      std::memcpy(&length, buffered().data(), sizeof(length));
      consume(sizeof(length));
      if (op.given && length != op.length) {
        const std::string why =
            absl::StrCat("the peer sent a frame of ", length,
                         " bytes where one of ", op.length, " was expected");
        fail(tcp_error(why), why, /*log=*/true);
        return;
      }
      if (!op.given) {
        if (length > limit) {
          const std::string why = absl::StrCat(
              "the peer announced a frame of ", length,
              " bytes, over the limit of ", limit);
          fail(tcp_error(why), why, /*log=*/true);
          return;
        }
        op.owned.reset(new char[std::max<uint64_t>(length, 1)]);
        op.ptr = op.owned.get();
        op.length = length;
      }
      op.have_length = true;
    }
    const size_t take = std::min(buffered().size(), op.length - op.done);
    if (take > 0) {
      std::memcpy(op.ptr + op.done, buffered().data(), take);
      consume(take);
      op.done += take;
    }
    if (op.done < op.length) {
      const size_t remaining = op.length - op.done;
      if (remaining >= kChunk) {
        const ssize_t n =
            ::recv(fd_, op.ptr + op.done, remaining, MSG_DONTWAIT);
        if (n > 0) {
          op.done += static_cast<size_t>(n);
          continue;
        }
        if (n == 0) {
          setError(TCP_TRANSPORT_ERROR(tp::EOFError));
          return;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        setError(TCP_TRANSPORT_ERROR(tp::SystemError, "recv", errno));
        return;
      }
      if (!fill_or_fail(kChunk)) break;
      continue;
    }
    ReadOp done = std::move(reads_.front());
    reads_.pop_front();
    done.fn(tp::Error::kSuccess, done.ptr, done.length);
  }
}

void ConnectionImpl::process_writes() {
  while (!error_ && fd_ >= 0) {
    iovec iov[kMaxIov];
    size_t count = 0;
    const size_t handshake_left = handshake_out_.size() - handshake_sent_;
    if (handshake_left > 0) {
      iov[count++] = {handshake_out_.data() + handshake_sent_, handshake_left};
    }
    if (state_ == State::kEstablished) {
      for (WriteOp& op : writes_) {
        if (count + 2 > kMaxIov) break;
        if (op.done < sizeof(op.header)) {
          iov[count++] = {reinterpret_cast<char*>(&op.header) + op.done,
                          sizeof(op.header) - op.done};
          if (op.header > 0) {
            iov[count++] = {const_cast<char*>(op.ptr), op.header};
          }
        } else {
          const size_t sent = op.done - sizeof(op.header);
          iov[count++] = {const_cast<char*>(op.ptr) + sent, op.header - sent};
        }
      }
    }
    if (count == 0) return;
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    const ssize_t n = ::sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      setError(TCP_TRANSPORT_ERROR(tp::SystemError, "sendmsg", errno));
      return;
    }
    size_t left = static_cast<size_t>(n);
    const size_t from_handshake = std::min(left, handshake_left);
    handshake_sent_ += from_handshake;
    left -= from_handshake;
    if (handshake_sent_ == handshake_out_.size()) {
      handshake_out_.clear();
      handshake_sent_ = 0;
    }
    std::vector<write_callback_fn> completed;
    while (left > 0 && !writes_.empty()) {
      WriteOp& op = writes_.front();
      const size_t total = sizeof(op.header) + op.header;
      const size_t step = std::min(left, total - op.done);
      op.done += step;
      left -= step;
      if (op.done < total) break;
      completed.push_back(std::move(op.fn));
      writes_.pop_front();
    }
    for (write_callback_fn& fn : completed) fn(tp::Error::kSuccess);
    if (static_cast<size_t>(n) == 0) return;
  }
}

void ConnectionImpl::handleErrorImpl() {
  for (ReadOp& op : reads_) {
    op.fn(error_, op.given ? op.ptr : nullptr, op.given ? op.length : 0);
  }
  reads_.clear();
  for (WriteOp& op : writes_) op.fn(error_);
  writes_.clear();
  if (fd_ >= 0) {
    if (interest_ != 0) context_->unwatch(fd_);
    interest_ = 0;
    ::close(fd_);
    fd_ = -1;
  }
  in_.clear();
  in_.shrink_to_fit();
  in_begin_ = in_end_ = 0;
  notify_listener(false);
  context_->unenroll(*this);
}

// ------------------------------------------------------------------ public

using Context = tpt::ContextBoilerplate<ContextImpl, ListenerImpl,
                                        ConnectionImpl>;

}  // namespace

std::shared_ptr<tpt::Context> create_tcp_transport(
    TcpTransportOptions options) {
  return std::make_shared<Context>(std::move(options));
}

}  // namespace tether::backends::internal
