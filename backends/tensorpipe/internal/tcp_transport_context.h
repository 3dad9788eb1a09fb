// The context of tether's TCP transport (tcp_transport.h): its errors, the
// rate limit of its refusal logs, and its loop. Internal to that transport;
// tcp_transport_listener.h and tcp_transport_connection.h build on it.
//
// Threads: one thread per context runs an epoll loop; every callback into
// TensorPipe runs there.
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONTEXT_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONTEXT_H_

#include <absl/time/time.h>
#include <sys/socket.h>
#include <tensorpipe/common/deferred_executor.h>
#include <tensorpipe/common/error.h>
#include <tensorpipe/transport/context_impl_boilerplate.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "backends/tensorpipe/internal/tcp_transport.h"

namespace tether::backends::internal::tcp {

namespace tp = ::tensorpipe;
namespace tpt = ::tensorpipe::transport;

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

class ContextImpl;
class ListenerImpl;
class ConnectionImpl;

// What the loop calls when a watched descriptor is ready.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void on_events(uint32_t events) = 0;
};

// The context owns the loop: one thread that waits in epoll_wait on the
// watched sockets, an eventfd for deferred functions and the next timer.
class ContextImpl final
    : public tpt::ContextImplBoilerplate<ContextImpl, ListenerImpl,
                                         ConnectionImpl>,
      public tp::EventLoopDeferredExecutor {
 public:
  // nullptr if the loop's descriptors cannot be made.
  static std::shared_ptr<ContextImpl> create(TcpTransportOptions options);

  ContextImpl(TcpTransportOptions options, int epoll_fd, int event_fd);
  ~ContextImpl() override;

  const TcpTransportOptions& options() const { return options_; }

  // Loop thread only: calls `handler` for `events` on `fd` (replacing what
  // was watched on it), until unwatch(fd).
  void watch(int fd, uint32_t events, std::shared_ptr<Handler> handler);
  void unwatch(int fd);

  // Loop thread only: runs `fn` on the loop after `delay`.
  void after(absl::Duration delay, std::function<void()> fn);

  // Loop thread only: whether a refusal may be logged now (at most
  // kLogBurst per window); `*suppressed` is how many were not since.
  bool may_log(int* suppressed);

 protected:
  void handleErrorImpl() override {}
  void joinImpl() override;
  void eventLoop() override;
  void wakeupEventLoopToDeferFunction() override { wake(); }

 private:
  void wake();
  void run_due_timers();

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

}  // namespace tether::backends::internal::tcp

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONTEXT_H_
