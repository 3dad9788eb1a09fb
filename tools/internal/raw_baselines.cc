#include "tools/internal/raw_baselines.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/toolkit/huge_page_memory.h"
#include "tools/internal/launcher_env.h"
#include "tools/internal/samples.h"

namespace tether::bench {
namespace {

// An IPv4 socket address of `host` (a literal) and `port`.
absl::StatusOr<sockaddr_in> ipv4(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw TCP: '", host, "' is not an IPv4 address"));
  }
  return addr;
}

absl::Status errno_status(const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<TcpPair> TcpPair::connect(int rank, c10d::Store& store,
                                         absl::Duration timeout) {
  const int one = 1;
  const std::string key = "tether_raw_tcp/address";
  int fd = -1;
  if (rank == 1) {
    absl::StatusOr<std::string> host = listen_address();
    if (!host.ok()) return host.status();
    // Port 0: the kernel picks a free one, so no other socket (a store's,
    // another run's, rank 0's own connect attempt) can hold it.
    absl::StatusOr<sockaddr_in> addr = ipv4(*host, 0);
    if (!addr.ok()) return addr.status();
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return errno_status("raw TCP socket");
    socklen_t length = sizeof(*addr);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
        ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&*addr), &length) != 0) {
      absl::Status s = errno_status("raw TCP listen");
      ::close(listener);
      return s;
    }
    const std::string published = absl::StrCat(*host, " ", ntohs(addr->sin_port));
    store.set(key, std::vector<uint8_t>(published.begin(), published.end()));
    fd = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    if (fd < 0) return errno_status("raw TCP accept");
  } else {
    store.wait({key}, absl::ToChronoMilliseconds(timeout));
    const std::vector<uint8_t> raw = store.get(key);
    const std::string text(raw.begin(), raw.end());
    const std::vector<std::string> parts = absl::StrSplit(text, ' ');
    int port = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) {
      return absl::InternalError(
          absl::StrCat("raw TCP: rank 1 published '", text, "', not 'ADDRESS PORT'"));
    }
    absl::StatusOr<sockaddr_in> addr = ipv4(parts[0], port);
    if (!addr.ok()) return addr.status();
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno_status("raw TCP socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0) {
      absl::Status s = errno_status("raw TCP connect");
      ::close(fd);
      return s;
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

double memcpy_gbps(size_t bytes, int iterations, bool fresh, bool huge_pages) {
  struct Free {
    void operator()(char* data) const { std::free(data); }
  };
  auto buffer_of = [&](int fill) {
    void* data = huge_pages ? internal::allocate_on_huge_pages(bytes)
                            : std::malloc(bytes);
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data, fill, bytes);  // the pages are in before the copies
    return std::unique_ptr<char[], Free>(static_cast<char*>(data));
  };
  std::unique_ptr<char[], Free> from = buffer_of(1);
  std::unique_ptr<char[], Free> to = buffer_of(0);
  std::vector<double> rates;
  for (int i = 0; i < iterations; ++i) {
    const Clock::time_point start = Clock::now();
    if (fresh) {
      // What a receiver does per message: allocate, fill, (later) free.
      std::unique_ptr<char[]> buffer(new char[bytes]);
      std::memcpy(buffer.get(), from.get(), bytes);
      to[0] = buffer[bytes - 1];  // the copy is used: not optimised away
    } else {
      std::memcpy(to.get(), from.get(), bytes);
    }
    rates.push_back(gbps(static_cast<double>(bytes), micros_since(start)));
    from[static_cast<size_t>(i) % bytes] = static_cast<char>(to[0] + 1);
  }
  std::sort(rates.begin(), rates.end());
  return rates.empty() ? 0 : rates[rates.size() / 2];
}

}  // namespace tether::bench
