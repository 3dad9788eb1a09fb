// A connection's socket, its loop events and its data frames
// (tcp_transport_connection.h).
#include "backends/tensorpipe/internal/tcp_transport_connection.h"

#include <absl/container/inlined_vector.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "backends/common/fd_assist.h"
#include "backends/tensorpipe/internal/tcp_transport_listener.h"

namespace tether::backends::tensorpipe::internal {
namespace {

thread_local GatheredWrites* t_gathering = nullptr;
// OpenedConnection: whether a scope is open on this thread, and the first
// connection opened in it.
thread_local bool t_noting_opened = false;
thread_local tcp::ConnectionImpl* t_opened = nullptr;

}  // namespace

OpenedConnection::OpenedConnection() {
  t_noting_opened = true;
  t_opened = nullptr;
}

OpenedConnection::~OpenedConnection() {
  t_noting_opened = false;
  t_opened = nullptr;
}

std::shared_ptr<tcp::ConnectionImpl> OpenedConnection::take() {
  tcp::ConnectionImpl* opened = t_opened;
  t_opened = nullptr;
  // Alive: the pipe that connect() returned holds it.
  return opened == nullptr ? nullptr : opened->shared_from_this();
}

void write_express(const std::shared_ptr<tcp::ConnectionImpl>& connection,
                   std::string frame) {
  connection->in_loop([connection, frame = std::move(frame)]() mutable {
    connection->express_from_loop(std::move(frame));
  });
}

void fail_express(const std::shared_ptr<tcp::ConnectionImpl>& connection,
                  std::string why) {
  connection->in_loop(
      [connection, why = std::move(why)] { connection->fail_from_loop(why); });
}

std::string express_peer(const tcp::ConnectionImpl& connection) {
  return connection.peer_name();
}

GatheredWrites::GatheredWrites() {
  if (t_gathering != nullptr) return;
  t_gathering = this;
  active_ = true;
}

GatheredWrites::~GatheredWrites() {
  if (!active_) return;
  t_gathering = nullptr;
  for (const std::shared_ptr<tcp::ConnectionImpl>& connection : connections_) {
    connection->flush_gathered();
  }
}

GatheredWrites* GatheredWrites::current() { return t_gathering; }

void GatheredWrites::add(std::shared_ptr<tcp::ConnectionImpl> connection) {
  for (const auto& known : connections_) {
    if (known == connection) return;
  }
  connections_.push_back(std::move(connection));
}

namespace tcp {

void note_opened(ConnectionImpl* connection) {
  if (t_noting_opened && t_opened == nullptr) t_opened = connection;
}

void ConnectionImpl::flush_gathered() {
  context_->deferToLoop(
      [self = shared_from_this()] { self->flush_when_idle(); });
}

void ConnectionImpl::flush_when_idle() {
  if (flush_queued_) return;
  flush_queued_ = true;
  context_->flush_when_idle(shared_from_this());
}

void ConnectionImpl::flush() {
  flush_queued_ = false;
  if (error_) return;
  if (state_ == State::kEstablished) process_writes();
  update_interest();
}

int ConnectionImpl::begin_assist() {
  if (context_->inLoop()) return -1;
  int fd = -1;
  context_->run_in_loop([this, &fd] {
    if (!wants_input()) return;
    ++assistants_;
    update_interest();
    fd = fd_;
  });
  return fd;
}

bool ConnectionImpl::assist_step() {
  bool more = false;
  context_->run_in_loop([this, &more] {
    if (!wants_input()) return;
    drained_ = false;
    process_reads(/*readable=*/true);
    if (!error_) update_interest();
    more = wants_input();
  });
  return more;
}

void ConnectionImpl::end_assist() {
  std::shared_ptr<ConnectionImpl> self = shared_from_this();
  context_->deferToLoop([self] {
    --self->assistants_;
    self->update_interest();
  });
}

void ConnectionImpl::initImplFromLoop() {
  context_->enroll(*this);
  const int on = 1;
  if (!server_) {
    SocketAddress address;
    if (tp::Error error =
            open_socket(peer_, SocketRole::kConnect, fd_, address)) {
      setError(std::move(error));
      return;
    }
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    if (::connect(fd_, address.get(), address.length) == 0) {
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
  context_->after(handshake_bound(), [weak] {
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
    drained_ = false;
    if (state_ == State::kEstablished) {
      process_reads(/*readable=*/true);
    } else {
      on_handshake_input();
    }
  }
  if (!error_ && (events & EPOLLOUT)) process_writes();
  if (!error_) update_interest();
}

ConnectionImpl::Fill ConnectionImpl::fill(size_t most) {
  if (drained_) return Fill::kAgain;
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
      drained_ = static_cast<size_t>(n) < most;
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
                      (state_ == State::kEstablished && socket_full_ &&
                       !writes_.empty());
  switch (state_) {
    case State::kConnecting:
      want = EPOLLOUT;
      break;
    case State::kHandshake:
    case State::kRefusing:
      want = EPOLLIN;
      break;
    case State::kEstablished:
      if (assistants_ == 0 && wants_input()) want = EPOLLIN;
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

bool ConnectionImpl::wants_input() const {
  return !error_ && fd_ >= 0 && state_ == State::kEstablished &&
         (!reads_.empty() || buffered().size() < kReadAhead);
}

void ConnectionImpl::readImplFromLoop(read_callback_fn fn) {
  ReadOp op;
  op.fn = std::move(fn);
  reads_.push_back(std::move(op));
  if (state_ == State::kEstablished) process_reads(/*readable=*/false);
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
  if (state_ == State::kEstablished) process_reads(/*readable=*/false);
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
      const std::string why =
          absl::StrCat("a malformed TensorPipe control message (", length,
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
  queue_write(std::move(op));
}

void ConnectionImpl::express_from_loop(std::string frame) {
  // Before the handshake ends it waits, as TensorPipe's writes do.
  if (error_) return;
  WriteOp op;
  op.header = frame.size() | kExpressBit;
  op.owned = std::move(frame);
  queue_write(std::move(op));
}

void ConnectionImpl::fail_from_loop(const std::string& why) {
  if (error_) return;
  fail(tcp_error(why), why, /*log=*/true);
}

void ConnectionImpl::queue_write(WriteOp op) {
  if (!context_->on_poller()) common::arm_fd_assist(shared_from_this());
  writes_.push_back(std::move(op));
  // Its own bytes, if any, now that it no longer moves.
  WriteOp& queued = writes_.back();
  if ((queued.header & kExpressBit) != 0) queued.ptr = queued.owned.data();
  if (GatheredWrites* gathering = GatheredWrites::current()) {
    gathering->add(shared_from_this());
    return;
  }
  // Sent when the loop runs out of tasks, with every write queued behind
  // this one: a message's writes (its descriptor, then each payload), and
  // the answers to every request read in this turn when their handlers
  // run in the loop. One sendmsg() for them, and the peer is woken once
  // (docs/decisions.md, "Mid-size messages on the tensorpipe backend").
  flush_when_idle();
}

void ConnectionImpl::process_reads(bool readable) {
  const size_t limit = context_->options().max_unsized_read_bytes;
  // With no read pending, a call reads ahead only on a readable socket,
  // and only if it has not read from it yet. What the chunk that completed
  // a descriptor brought of the payloads after it is copied out of the
  // buffer; the rest stays in the socket until TensorPipe asks for it (in
  // this turn of the loop) and is read straight into its destination.
  // Why not more: TensorPipe posts a message's payload reads one task after
  // another, so a call that completed one read and then read ahead would
  // bring the next payload (a storage, say, after the call's small encoded
  // payload) into the buffer, to be copied out of it and moved within it
  // whenever the buffer is compacted. A poller's wake-up with nothing
  // pending still reads (the socket is level-triggered: it must not spin).
  bool may_read_ahead = readable;
  auto fill_once = [&](size_t most) {
    may_read_ahead = false;
    return fill_or_fail(most);
  };
  while (!error_ && state_ == State::kEstablished) {
    // Between TensorPipe's frames, an express frame is the sink's.
    if ((reads_.empty() || !reads_.front().have_length) &&
        buffered().size() >= sizeof(uint64_t) && next_is_express()) {
      if (take_express() == Express::kTaken) continue;
      break;
    }
    if (reads_.empty()) {
      if (!may_read_ahead || buffered().size() >= kReadAhead) break;
      if (!fill_once(kChunk)) break;
      continue;
    }
    ReadOp& op = reads_.front();
    if (!op.have_length) {
      if (buffered().size() < sizeof(uint64_t)) {
        if (!fill_once(kChunk)) break;
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
          const std::string why =
              absl::StrCat("the peer announced a frame of ", length,
                           " bytes, over the limit of ", limit);
          fail(tcp_error(why), why, /*log=*/true);
          return;
        }
        // The whole frame is buffered: handed over from the buffer, without
        // a copy. TensorPipe parses it inside the callback, and nothing
        // fills the buffer until the callback returns: this runs in the
        // loop, and whatever the callback asks of the connection is
        // deferred to it.
        if (buffered().size() >= length) {
          ReadOp done = std::move(reads_.front());
          reads_.pop_front();
          const char* frame = buffered().data();
          consume(length);
          done.fn(tp::Error::kSuccess, frame, length);
          continue;
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
      if (remaining >= kDirect) {
        if (drained_) break;
        may_read_ahead = false;
        const ssize_t n =
            ::recv(fd_, op.ptr + op.done, remaining, MSG_DONTWAIT);
        if (n > 0) {
          op.done += static_cast<size_t>(n);
          drained_ = static_cast<size_t>(n) < remaining;
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
      if (!fill_once(kChunk)) break;
      continue;
    }
    ReadOp done = std::move(reads_.front());
    reads_.pop_front();
    done.fn(tp::Error::kSuccess, done.ptr, done.length);
  }
}

ConnectionImpl::Express ConnectionImpl::take_express() {
  uint64_t word = 0;
  std::memcpy(&word, buffered().data(), sizeof(word));
  const uint64_t length = word & ~kExpressBit;
  const ExpressSink& sink = context_->options().express_sink;
  if (!sink || length > kMaxExpressBytes) {
    const std::string why =
        !sink ? std::string("the peer sent an express frame, which this "
                            "connection does not take")
              : absl::StrCat("the peer announced an express frame of ",
                             length, " bytes, over the limit of ",
                             kMaxExpressBytes);
    fail(tcp_error(why), why, /*log=*/true);
    return Express::kFailed;
  }
  const size_t total = sizeof(word) + length;
  while (buffered().size() < total) {
    const Fill result = fill(std::max(kChunk, total - buffered().size()));
    if (result == Fill::kClosed) {
      setError(fill_error_);
      return Express::kFailed;
    }
    if (result == Fill::kAgain) return Express::kWanting;
  }
  consume(sizeof(word));
  // Handed over from the buffer, as a whole TensorPipe frame is: nothing
  // fills it until the sink returns.
  const absl::string_view frame(buffered().data(), length);
  consume(length);
  sink(shared_from_this(), frame);
  return Express::kTaken;
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
          if (op.length() > 0) {
            iov[count++] = {const_cast<char*>(op.ptr), op.length()};
          }
        } else {
          const size_t sent = op.done - sizeof(op.header);
          iov[count++] = {const_cast<char*>(op.ptr) + sent,
                          op.length() - sent};
        }
      }
    }
    if (count == 0) {
      socket_full_ = false;
      return;
    }
    size_t offered = 0;
    for (size_t i = 0; i < count; ++i) offered += iov[i].iov_len;
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    const ssize_t n = ::sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        socket_full_ = true;
        return;
      }
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
    absl::InlinedVector<write_callback_fn, 8> completed;
    while (left > 0 && !writes_.empty()) {
      WriteOp& op = writes_.front();
      const size_t total = sizeof(op.header) + op.length();
      const size_t step = std::min(left, total - op.done);
      op.done += step;
      left -= step;
      if (op.done < total) break;
      if (op.fn) completed.push_back(std::move(op.fn));
      writes_.pop_front();
    }
    for (write_callback_fn& fn : completed) fn(tp::Error::kSuccess);
    // A short write: the socket's buffer is full; EPOLLOUT says when not.
    if (static_cast<size_t>(n) < offered) {
      socket_full_ = true;
      return;
    }
  }
}

void ConnectionImpl::handleErrorImpl() {
  for (ReadOp& op : reads_) {
    op.fn(error_, op.given ? op.ptr : nullptr, op.given ? op.length : 0);
  }
  reads_.clear();
  for (WriteOp& op : writes_) {
    if (op.fn) op.fn(error_);
  }
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

}  // namespace tcp
}  // namespace tether::backends::tensorpipe::internal
