#include "tools/internal/raw_baselines.h"

#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "tools/internal/samples.h"

namespace tether::bench {
namespace {

sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

absl::Status errno_status(const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<TcpPair> TcpPair::connect(int rank, int port,
                                         absl::Duration timeout) {
  const int one = 1;
  sockaddr_in addr = loopback(port);
  const absl::Time deadline = absl::Now() + timeout;
  int fd = -1;
  if (rank == 1) {
    int listener = -1;
    while (true) {
      listener = ::socket(AF_INET, SOCK_STREAM, 0);
      ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
          ::listen(listener, 1) == 0) {
        break;
      }
      const bool in_use = errno == EADDRINUSE;
      absl::Status s = errno_status("raw TCP listen");
      ::close(listener);
      // In use, often by the peer's own connect attempt (below): it lets go.
      if (!in_use || absl::Now() > deadline) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    fd = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    if (fd < 0) return errno_status("raw TCP accept");
  } else {
    while (true) {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        // With nothing listening yet, the kernel may pick the very port as
        // this socket's own: TCP's simultaneous open then connects it to
        // itself, and holds the port the peer is to listen on.
        sockaddr_in self{};
        socklen_t len = sizeof(self);
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len);
        if (ntohs(self.sin_port) != port) break;
      }
      ::close(fd);
      fd = -1;
      if (absl::Now() > deadline) return errno_status("raw TCP connect");
      // The peer's listener is starting.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return TcpPair(rank, fd);
}

TcpPair::TcpPair(TcpPair&& other) noexcept
    : rank_(other.rank_), fd_(std::exchange(other.fd_, -1)) {}

TcpPair& TcpPair::operator=(TcpPair&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    rank_ = other.rank_;
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

TcpPair::~TcpPair() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status TcpPair::send_all(const char* data, size_t bytes) {
  for (size_t done = 0; done < bytes;) {
    ssize_t n = ::send(fd_, data + done, bytes - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_status("raw TCP send");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status TcpPair::recv_all(char* data, size_t bytes) {
  for (size_t done = 0; done < bytes;) {
    ssize_t n = ::recv(fd_, data + done, bytes - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return absl::UnavailableError("raw TCP: the peer closed");
    if (n < 0) return errno_status("raw TCP recv");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status tcp_ping_pong(TcpPair& pair, size_t bytes, int warmup,
                           int iterations, std::vector<double>& samples_us) {
  std::vector<char> buffer(bytes, 1);
  if (pair.rank() == 1) {
    for (int i = 0; i < warmup + iterations; ++i) {
      if (absl::Status s = pair.recv_all(buffer.data(), bytes); !s.ok()) return s;
      if (absl::Status s = pair.send_all(buffer.data(), bytes); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return time_calls(warmup, iterations, [&]() -> absl::Status {
    if (absl::Status s = pair.send_all(buffer.data(), bytes); !s.ok()) return s;
    return pair.recv_all(buffer.data(), bytes);
  }, samples_us);
}

absl::StatusOr<double> tcp_stream(TcpPair& pair, size_t total, size_t chunk) {
  std::vector<char> buffer(chunk, 1);
  char ack = 0;
  if (pair.rank() == 1) {
    for (size_t done = 0; done < total; done += chunk) {
      const size_t n = std::min(chunk, total - done);
      if (absl::Status s = pair.recv_all(buffer.data(), n); !s.ok()) return s;
    }
    if (absl::Status s = pair.send_all(&ack, 1); !s.ok()) return s;
    return 0.0;
  }
  const Clock::time_point start = Clock::now();
  for (size_t done = 0; done < total; done += chunk) {
    const size_t n = std::min(chunk, total - done);
    if (absl::Status s = pair.send_all(buffer.data(), n); !s.ok()) return s;
  }
  if (absl::Status s = pair.recv_all(&ack, 1); !s.ok()) return s;
  return gbps(static_cast<double>(total), micros_since(start));
}

double memcpy_gbps(size_t bytes, int iterations, bool fresh) {
  std::vector<char> from(bytes, 1);
  std::vector<char> to(bytes, 0);
  std::memcpy(to.data(), from.data(), bytes);  // fault the pages in
  std::vector<double> rates;
  for (int i = 0; i < iterations; ++i) {
    const Clock::time_point start = Clock::now();
    if (fresh) {
      // What a receiver does per message: allocate, fill, (later) free.
      std::unique_ptr<char[]> buffer(new char[bytes]);
      std::memcpy(buffer.get(), from.data(), bytes);
      to[0] = buffer[bytes - 1];  // the copy is used: not optimised away
    } else {
      std::memcpy(to.data(), from.data(), bytes);
    }
    rates.push_back(gbps(static_cast<double>(bytes), micros_since(start)));
    from[static_cast<size_t>(i) % bytes] = static_cast<char>(to[0] + 1);
  }
  std::sort(rates.begin(), rates.end());
  return rates.empty() ? 0 : rates[rates.size() / 2];
}

}  // namespace tether::bench
