#include "backends/tensorpipe/internal/tcp_transport_context.h"

#include <absl/strings/str_cat.h>
#include <c10/util/Logging.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <tensorpipe/common/system.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "backends/tensorpipe/internal/tcp_transport_connection.h"

namespace tether::backends::tensorpipe::internal::tcp {

tp::Error refused_error(std::string reason) {
  return TCP_TRANSPORT_ERROR(RefusedError, std::move(reason));
}

tp::Error tcp_error(std::string what) {
  return TCP_TRANSPORT_ERROR(TcpError, std::move(what));
}

tp::Error open_socket(const std::string& text, SocketRole role, int& fd,
                      SocketAddress& address) {
  fd = -1;
  address.length = 0;
  if (!parse_socket_address(text, &address.storage, &address.length)) {
    return tcp_error(role == SocketRole::kConnect
                         ? absl::StrCat("cannot connect to '", text,
                                        "': not an IP address and port")
                         : absl::StrCat("cannot listen on '", text,
                                        "': not an IP address (and port)"));
  }
  fd = ::socket(address.storage.ss_family,
                SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return TCP_TRANSPORT_ERROR(tp::SystemError, "socket", errno);
  return tp::Error::kSuccess;
}

std::shared_ptr<ContextImpl> ContextImpl::create(TcpTransportOptions options) {
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return nullptr;
  const int event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd < 0) {
    ::close(epoll_fd);
    return nullptr;
  }
  return std::make_shared<ContextImpl>(std::move(options), epoll_fd, event_fd);
}

ContextImpl::ContextImpl(TcpTransportOptions options, int epoll_fd,
                         int event_fd)
    : ContextImplBoilerplate(kTcpDomainDescriptor),
      options_(std::move(options)),
      epoll_fd_(epoll_fd),
      event_fd_(event_fd) {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 0;  // record 0: the eventfd
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &event);
  poller_ = std::thread([this] { poll(); });
  poller_id_ = poller_.get_id();
}

ContextImpl::~ContextImpl() {
  // join() stops the poller; a context that was never joined stops it here.
  if (poller_.joinable()) {
    stopping_ = true;
    wake();
    poller_.join();
  }
  ::close(event_fd_);
  ::close(epoll_fd_);
}

void ContextImpl::watch(int fd, uint32_t events,
                        std::shared_ptr<Handler> handler) {
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

void ContextImpl::unwatch(int fd) {
  auto it = records_.find(fd);
  if (it == records_.end()) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(it->second);
  records_.erase(it);
}

void ContextImpl::after(absl::Duration delay, std::function<void()> fn) {
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(delay);
  const bool earliest = timers_.empty() || deadline < timers_.begin()->first;
  timers_.emplace(deadline, std::move(fn));
  if (!earliest) return;
  publish_next_timer();
  // The poller computes its timeout again after each pass; elsewhere it
  // may be waiting with a later one.
  if (std::this_thread::get_id() != poller_id_) wake();
}

void ContextImpl::publish_next_timer() {
  next_timer_ns_ = timers_.empty()
                       ? kNoTimer
                       : std::chrono::duration_cast<std::chrono::nanoseconds>(
                             timers_.begin()->first.time_since_epoch())
                             .count();
}

bool ContextImpl::may_log(int* suppressed) {
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

void ContextImpl::joinImpl() {
  stopping_ = true;
  wake();
  poller_.join();
  // What is left runs in the loop of whichever thread defers next.
  deferToLoop([this] {
    timers_.clear();
    publish_next_timer();
  });
}

void ContextImpl::poll() {
  tp::setThreadName("tether-tcp");
  std::vector<epoll_event> events(64);
  std::vector<epoll_event> ready;
  PollWindow window(options_.poll);
  bool polling = false;
  while (!stopping_) {
    int timeout_ms = -1;
    if (const int64_t next = next_timer_ns_; next != kNoTimer) {
      const int64_t now =
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::steady_clock::now().time_since_epoch())
              .count();
      // Rounded up: a timer is never run before its deadline.
      timeout_ms = static_cast<int>(
          std::clamp<int64_t>((next - now + 999999) / 1000000, 0, 60000));
    }
    const bool polled = polling;  // this look does not sleep
    const int n = ::epoll_wait(epoll_fd_, events.data(),
                               static_cast<int>(events.size()),
                               polled ? 0 : timeout_ms);
    if (n < 0 && errno != EINTR) {
      PLOG(ERROR) << options_.log_prefix << ": epoll_wait";
    }
    if (n > 0) {
      window.worked();
      polling = window.enabled();
    } else if (polled) {
      // Polls again (yielding first) or sleeps in the next look; a timer
      // that is due runs now.
      polling = window.keep_polling();
      if (timeout_ms != 0) continue;
    }
    ready.clear();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        uint64_t count = 0;
        while (::read(event_fd_, &count, sizeof(count)) > 0) {
        }
        continue;
      }
      ready.push_back(events[i]);
    }
    if (stopping_) return;
    // Waits until it ran, so that the same level-triggered events are not
    // polled again before they were handled.
    run_in_loop([this, &ready] { dispatch(ready); });
  }
}

void ContextImpl::deferToLoop(TTask fn) {
  {
    std::lock_guard<std::mutex> lock(loop_mu_);
    tasks_.push_back(std::move(fn));
    if (loop_thread_ != std::thread::id()) return;
    loop_thread_ = std::this_thread::get_id();
  }
  for (;;) {
    TTask task;
    {
      std::lock_guard<std::mutex> lock(loop_mu_);
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      } else if (flushes_.empty()) {
        tasks_since_flush_ = 0;
        loop_thread_ = std::thread::id();
        return;
      }
    }
    if (task) {
      task();
      if (++tasks_since_flush_ < kTasksPerFlush) continue;
    }
    flush_writes();
  }
}

void ContextImpl::flush_writes() {
  // What the writes' callbacks queue runs next, and its writes leave with
  // the next flush.
  tasks_since_flush_ = 0;
  flushing_.swap(flushes_);
  for (const std::shared_ptr<ConnectionImpl>& connection : flushing_) {
    connection->flush();
  }
  flushing_.clear();
}

void ContextImpl::run_in_loop(const std::function<void()>& fn) {
  // Runs here unless another thread is in the loop; then that thread runs
  // it and this one waits.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  deferToLoop([&fn, &mu, &cv, &done] {
    fn();
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&done] { return done; });
}

void ContextImpl::dispatch(const std::vector<epoll_event>& ready) {
  for (const epoll_event& event : ready) {
    // A record replaced or removed earlier in this batch is stale.
    auto it = handlers_.find(event.data.u64);
    if (it == handlers_.end()) continue;
    std::shared_ptr<Handler> handler = it->second;
    handler->on_events(event.events);
  }
  const auto now = std::chrono::steady_clock::now();
  bool ran = false;
  while (!timers_.empty() && timers_.begin()->first <= now) {
    std::function<void()> fn = std::move(timers_.begin()->second);
    timers_.erase(timers_.begin());
    ran = true;
    fn();
  }
  if (ran) publish_next_timer();
}

void ContextImpl::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
}

}  // namespace tether::backends::tensorpipe::internal::tcp
