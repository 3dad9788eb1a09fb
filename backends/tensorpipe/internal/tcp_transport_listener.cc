#include "backends/tensorpipe/internal/tcp_transport_listener.h"

#include <absl/strings/str_cat.h>
#include <c10/util/Logging.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backends/tensorpipe/internal/tcp_transport_connection.h"

namespace tether::backends::tensorpipe::internal::tcp {

void ListenerImpl::initImplFromLoop() {
  context_->enroll(*this);
  SocketAddress address;
  if (tp::Error error =
          open_socket(requested_, SocketRole::kListen, fd_, address)) {
    setError(std::move(error));
    return;
  }
  const int on = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(fd_, address.get(), address.length) != 0) {
    setError(TCP_TRANSPORT_ERROR(tp::SystemError, "bind", errno));
    return;
  }
  // The kernel's full backlog (net.core.somaxconn): a world of many workers
  // connects to one peer at once, and past the backlog their connections
  // wait for a SYN retransmit (a second or more) each.
  if (::listen(fd_, SOMAXCONN) != 0) {
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
    if (handshaking_.size() >= kMaxHandshakes) {
      // Backpressure, not refusal: the rest wait in the kernel's backlog
      // until a handshake ends (handshake_done). Closing them failed the
      // calls of a busy group's own workers (32 workers connecting to rank 0
      // at once, as a group's first barrier does).
      context_->unwatch(fd_);
      full_ = true;
      return;
    }
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
                       << ": cannot accept a connection on " << address_ << " ("
                       << std::strerror(errno) << "); pausing 100 ms";
        }
        context_->unwatch(fd_);
        paused_ = true;
        std::weak_ptr<ListenerImpl> weak = shared_from_this();
        context_->after(absl::Milliseconds(100), [weak] {
          std::shared_ptr<ListenerImpl> self = weak.lock();
          if (self == nullptr || self->error_ || !self->paused_) return;
          self->paused_ = false;
          if (!self->full_) self->context_->watch(self->fd_, EPOLLIN, self);
        });
        return;
      }
      setError(TCP_TRANSPORT_ERROR(tp::SystemError, "accept", errno));
      return;
    }
    const uint64_t key = next_key_++;
    handshaking_[key] = createAndInitConnection(
        fd, format_address(from),
        std::weak_ptr<ListenerImpl>(shared_from_this()), key);
  }
}

void ListenerImpl::handshake_done(uint64_t key, bool ok) {
  auto it = handshaking_.find(key);
  if (it == handshaking_.end()) return;
  std::shared_ptr<tpt::Connection> connection = std::move(it->second);
  handshaking_.erase(it);
  if (full_ && !error_) {
    full_ = false;
    if (!paused_) context_->watch(fd_, EPOLLIN, shared_from_this());
  }
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

}  // namespace tether::backends::tensorpipe::internal::tcp
