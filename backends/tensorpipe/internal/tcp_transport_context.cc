#include "backends/tensorpipe/internal/tcp_transport_context.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace tether::backends::internal::tcp {

tp::Error refused_error(std::string reason) {
  return TCP_TRANSPORT_ERROR(RefusedError, std::move(reason));
}

tp::Error tcp_error(std::string what) {
  return TCP_TRANSPORT_ERROR(TcpError, std::move(what));
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
  startThread("tether-tcp");
}

ContextImpl::~ContextImpl() {
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
  timers_.emplace(
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(delay),
      std::move(fn));
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
  joinThread();
  timers_.clear();
}

void ContextImpl::eventLoop() {
  std::vector<epoll_event> events(64);
  for (;;) {
    int timeout_ms = -1;
    if (!timers_.empty()) {
      const auto wait =
          timers_.begin()->first - std::chrono::steady_clock::now();
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

void ContextImpl::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
}

void ContextImpl::run_due_timers() {
  const auto now = std::chrono::steady_clock::now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    std::function<void()> fn = std::move(timers_.begin()->second);
    timers_.erase(timers_.begin());
    fn();
  }
}

}  // namespace tether::backends::internal::tcp
