#include "testing/raw_sockets.h"

#include <absl/status/status.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace tether::testing {
namespace {

int poll_ms(absl::Duration left) {
  return static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
}

// `target` as a sockaddr; its length.
socklen_t address_of(const ListeningAddress& target, sockaddr_storage* out) {
  if (target.unix_socket) {
    auto* a = reinterpret_cast<sockaddr_un*>(out);
    a->sun_family = AF_UNIX;
    std::string path = target.host;
    const bool abstract = !path.empty() && path[0] == '@';
    if (abstract) path[0] = '\0';
    if (path.size() >= sizeof(a->sun_path)) return 0;
    std::memcpy(a->sun_path, path.data(), path.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) +
                                  path.size() + (abstract ? 0 : 1));
  }
  if (target.ipv6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(out);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(target.port));
    ::inet_pton(AF_INET6, target.host.c_str(), &a->sin6_addr);
    return sizeof(*a);
  }
  auto* a = reinterpret_cast<sockaddr_in*>(out);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(target.port));
  ::inet_pton(AF_INET, target.host.c_str(), &a->sin_addr);
  return sizeof(*a);
}

}  // namespace

int connect_to(const ListeningAddress& target, absl::Duration bound) {
  sockaddr_storage address{};
  const socklen_t length = address_of(target, &address);
  if (length == 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = ::socket(address.ss_family,
                          SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const absl::Time end = absl::Now() + bound;
  int connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), length);
  // A unix listener with a full backlog refuses at once (EAGAIN): again,
  // until the bound.
  while (connected != 0 && errno == EAGAIN && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), length);
  }
  if (connected != 0) {
    if (errno != EINPROGRESS) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t size = sizeof(error);
    if (::poll(&p, 1, poll_ms(end - absl::Now())) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0 ||
        error != 0) {
      ::close(fd);
      errno = error != 0 ? error : ETIMEDOUT;
      return -1;
    }
  }
  return fd;
}

bool send_all(int fd, absl::string_view bytes, absl::Duration bound) {
  const absl::Time end = absl::Now() + bound;
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    const absl::Duration left = end - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, poll_ms(left));
  }
  return true;
}

absl::StatusOr<std::string> receive_some(int fd, absl::Duration bound,
                                         size_t at_most) {
  const absl::Time end = absl::Now() + bound;
  for (;;) {
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, std::min(sizeof(buffer), at_most), 0);
    if (n > 0) return std::string(buffer, static_cast<size_t>(n));
    if (n == 0) return absl::UnavailableError("the peer ended the connection");
    if (errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("the connection failed: ", std::strerror(errno)));
    }
    const absl::Duration left = end - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("nothing arrived within ", absl::FormatDuration(bound)));
    }
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, poll_ms(left));
  }
}

void reset(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

std::vector<bool> ended_within(const std::vector<int>& fds,
                               absl::Duration bound) {
  std::vector<bool> ended(fds.size(), false);
  const absl::Time end = absl::Now() + bound;
  size_t open = fds.size();
  while (open > 0) {
    const absl::Duration left = end - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    std::vector<pollfd> polls;
    std::vector<size_t> index;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (ended[i]) continue;
      polls.push_back({fds[i], POLLIN, 0});
      index.push_back(i);
    }
    if (::poll(polls.data(), polls.size(), poll_ms(left)) <= 0) continue;
    for (size_t k = 0; k < polls.size(); ++k) {
      if (polls[k].revents == 0) continue;
      char buffer[4096];
      ssize_t n;
      while ((n = ::recv(fds[index[k]], buffer, sizeof(buffer), 0)) > 0) {
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        ended[index[k]] = true;
        --open;
      }
    }
  }
  return ended;
}

bool send_and_expect_close(const ListeningAddress& target,
                           absl::string_view bytes, absl::Duration bound) {
  const int fd = connect_to(target, bound);
  if (fd < 0) {
    ADD_FAILURE() << "cannot connect to " << target.to_string() << ": "
                  << std::strerror(errno);
    return false;
  }
  // The peer may close as soon as it has seen enough: the rest of the
  // bytes may be refused.
  send_all(fd, bytes, bound);
  const bool closed = ended_within({fd}, bound)[0];
  ::close(fd);
  return closed;
}

}  // namespace tether::testing
