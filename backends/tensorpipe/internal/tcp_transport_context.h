// The context of tether's TCP transport (tcp_transport.h): its errors, the
// rate limit of its refusal logs, and its loop. Internal to that transport;
// tcp_transport_listener.h and tcp_transport_connection.h build on it.
//
// Threads: see ContextImpl; every callback into TensorPipe runs in its
// loop, on the thread that is in it.
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONTEXT_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONTEXT_H_

#include <absl/strings/string_view.h>
#include <absl/time/time.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <tensorpipe/common/deferred_executor.h>
#include <tensorpipe/common/error.h>
#include <tensorpipe/transport/context_impl_boilerplate.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/tensorpipe/internal/tcp_transport.h"

namespace tether::backends::tensorpipe::internal::tcp {

namespace tp = ::tensorpipe;
namespace tpt = ::tensorpipe::transport;

// The most tasks the loop runs between two flushes of the queued writes
// (ContextImpl): about as many writes as one sendmsg() takes (kMaxIov).
inline constexpr int kTasksPerFlush = 64;

// Refusals logged per window; the rest are counted in the next line.
inline constexpr int kLogBurst = 10;
inline constexpr auto kLogWindow = std::chrono::seconds(10);

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
#define TCP_TRANSPORT_ERROR(T, ...) \
  ::tensorpipe::Error(std::make_shared<T>(__VA_ARGS__), __FILE__, __LINE__)

tp::Error refused_error(std::string reason);
tp::Error tcp_error(std::string what);

// "ip:port" or "[ip6]:port".
std::string format_address(const sockaddr_storage& storage);

// A socket address, as connect() and bind() take it.
struct SocketAddress {
  sockaddr_storage storage;
  socklen_t length = 0;

  const sockaddr* get() const {
    return reinterpret_cast<const sockaddr*>(&storage);
  }
};

// What a socket is opened for, which says what its address must be.
enum class SocketRole {
  kConnect,  // an IP address and port
  kListen,   // an IP address (and port: 0, the kernel picks, if none)
};

// Parses `text` (parse_socket_address) into `address` and opens a
// non-blocking, close-on-exec stream socket of its family into `fd` (-1 on
// error), for a connection and a listener alike. Text that does not parse:
// "cannot connect to '<text>': not an IP address and port" (or "cannot
// listen on ...").
tp::Error open_socket(const std::string& text, SocketRole role, int& fd,
                      SocketAddress& address);

class ContextImpl;
class ListenerImpl;
class ConnectionImpl;

// What the loop calls when a watched descriptor is ready.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void on_events(uint32_t events) = 0;
};

// The context owns the loop and the poller.
//
// The loop is not a thread: it is whichever thread is running the
// transport's work at the moment (as TensorPipe's OnDemandDeferredExecutor).
// A thread that writes to a connection enters the loop and sendmsg()s
// itself when no other thread is in it, instead of handing the write to a
// loop thread and waking it (two context switches and an eventfd write per
// small call); work deferred while another thread is in the loop runs
// there, in order, before that thread leaves.
//
// Writes are sent when the loop runs out of tasks (flush_when_idle()), not
// one by one: the answers to a batch of requests read at once (written by
// handlers that run in the loop, each queued as a task behind the one
// that read them) leave in one sendmsg() per connection, and the peer is
// woken once for them. A lone write leaves at the end of the turn that
// made it; one made while another thread is in the loop, with that
// thread's turn. A loop that does not run dry sends what it gathered every
// kTasksPerFlush tasks.
//
// The poller is one thread per context that waits in epoll_wait on the
// watched sockets, the eventfd (which wakes it for a new earliest timer
// and at join) and the next timer's deadline; it then enters the loop
// with what it found, and waits until that ran before it polls again (the
// sockets are level-triggered).
class ContextImpl final
    : public tpt::ContextImplBoilerplate<ContextImpl, ListenerImpl,
                                         ConnectionImpl> {
 public:
  // nullptr if the poller's descriptors cannot be made.
  static std::shared_ptr<ContextImpl> create(TcpTransportOptions options);

  ContextImpl(TcpTransportOptions options, int epoll_fd, int event_fd);
  ~ContextImpl() override;

  const TcpTransportOptions& options() const { return options_; }

  // Runs `fn` in the loop: at once on this thread if no thread is in it
  // (which then runs every task queued meanwhile, and the flushes, before
  // it leaves), else queued behind the tasks of the thread that is.
  void deferToLoop(TTask fn) override;
  bool inLoop() const override {
    return loop_thread_ == std::this_thread::get_id();
  }

  // Loop only: `connection`'s queued writes are sent once the loop has no
  // task left (ConnectionImpl::flush()); once per call.
  void flush_when_idle(std::shared_ptr<ConnectionImpl> connection) {
    flushes_.push_back(std::move(connection));
  }

  // Not in the loop: runs `fn` in the loop and returns once it has run (on
  // this thread, or on the thread in the loop, this one waiting).
  void run_in_loop(const std::function<void()>& fn);

  // Whether this is the poller thread.
  bool on_poller() const {
    return std::this_thread::get_id() == poller_id_;
  }

  // Loop only: calls `handler` for `events` on `fd` (replacing what was
  // watched on it), until unwatch(fd).
  void watch(int fd, uint32_t events, std::shared_ptr<Handler> handler);
  void unwatch(int fd);

  // Loop only: runs `fn` in the loop after `delay`.
  void after(absl::Duration delay, std::function<void()> fn);

  // Loop only: whether a refusal may be logged now (at most kLogBurst per
  // window); `*suppressed` is how many were not since.
  bool may_log(int* suppressed);

 protected:
  void handleErrorImpl() override {}
  // Stops and joins the poller. Not in the loop.
  void joinImpl() override;

 private:
  // The poller thread's body.
  void poll();
  // Loop only: sends the writes of every connection in flushes_.
  void flush_writes();
  // Loop only: calls the handlers of `ready` and the due timers.
  void dispatch(const std::vector<epoll_event>& ready);
  // Wakes the poller.
  void wake();
  // Loop only: publishes the earliest timer's deadline to the poller.
  void publish_next_timer();

  const TcpTransportOptions options_;
  const int epoll_fd_;
  const int event_fd_;
  // The loop: the thread in it (none: the default id), its queued tasks.
  std::mutex loop_mu_;
  std::atomic<std::thread::id> loop_thread_{std::thread::id()};
  std::deque<TTask> tasks_;  // guarded by loop_mu_
  // Loop only: connections whose writes wait for the loop to be idle, and
  // those being flushed (kept to reuse their storage); tasks run since the
  // last flush.
  std::vector<std::shared_ptr<ConnectionImpl>> flushes_;
  std::vector<std::shared_ptr<ConnectionImpl>> flushing_;
  int tasks_since_flush_ = 0;
  std::atomic<bool> stopping_{false};
  // The earliest timer's deadline (steady clock, ns since its epoch), or
  // kNoTimer; written in the loop, read by the poller.
  static constexpr int64_t kNoTimer = INT64_MAX;
  std::atomic<int64_t> next_timer_ns_{kNoTimer};
  // Loop only.
  uint64_t next_record_ = 1;
  std::unordered_map<int, uint64_t> records_;
  std::unordered_map<uint64_t, std::shared_ptr<Handler>> handlers_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>>
      timers_;
  std::chrono::steady_clock::time_point log_window_start_{};
  int logged_in_window_ = 0;
  int suppressed_ = 0;
  // Last: started once everything above is ready.
  std::thread poller_;
  std::thread::id poller_id_;
};

}  // namespace tether::backends::tensorpipe::internal::tcp

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONTEXT_H_
