#include "backends/libfabric/internal/listener_guard.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

namespace tether::backends::libfabric::internal {
namespace {

constexpr absl::Duration kBound = absl::Seconds(1);

// A listening socket on 127.0.0.1, as the tcp provider opens one (its
// accepted sockets blocking, as the provider's are).
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address),
                     sizeof(address)),
              0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t length = sizeof(address_);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address_), &length);
  }
  ~Listener() { ::close(fd_); }

  // What fi_getname gives for it.
  std::string name() const {
    return std::string(reinterpret_cast<const char*>(&address_),
                       sizeof(address_));
  }

  // A client connected to it, and the server's side of that connection.
  std::pair<int, int> connect_one() const {
    const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::connect(client, reinterpret_cast<const sockaddr*>(&address_),
                        sizeof(address_)),
              0);
    const int server = ::accept(fd_, nullptr, nullptr);
    EXPECT_GE(server, 0);
    return {client, server};
  }

  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  sockaddr_in address_{};
};

// Waits (up to 10 s) until `fd` has something to read or an end.
void wait_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
}

// What the provider's next read of `fd` sees: 0 at the end of the stream,
// else -errno.
int read_result(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
  return n >= 0 ? static_cast<int>(n) : -errno;
}

TEST(ListenerGuard, OnlyForIpAddresses) {
  EXPECT_EQ(ListenerGuard::for_name("fi_shm://1234", kBound), nullptr);
  EXPECT_EQ(ListenerGuard::for_name("", kBound), nullptr);
  Listener listener;
  EXPECT_NE(ListenerGuard::for_name(listener.name(), kBound), nullptr);
}

TEST(ListenerGuard, ResetsARequestWhoseClientLeft) {
  Listener listener;
  auto guard = ListenerGuard::for_name(listener.name(), kBound);
  ASSERT_NE(guard, nullptr);
  auto [client, server] = listener.connect_one();
  ::close(client);
  wait_readable(server);  // the client's FIN: CLOSE_WAIT
  const absl::Time now = absl::Now();
  const ListenerGuard::Swept swept = guard->sweep(now);
  EXPECT_EQ(swept.pending, 1);
  EXPECT_EQ(swept.reset, 1);
  // A real error, which the provider closes the socket for (a plain end of
  // stream it may take for "try later").
  EXPECT_EQ(read_result(server), -ECONNRESET);
  // Not reset twice while the provider has yet to look.
  EXPECT_EQ(guard->sweep(now).reset, 0);
  ::close(server);
  EXPECT_EQ(guard->sweep(now).pending, 0);
}

TEST(ListenerGuard, ResetsASilentRequestAfterTheBound) {
  Listener listener;
  auto guard = ListenerGuard::for_name(listener.name(), kBound);
  ASSERT_NE(guard, nullptr);
  auto [client, server] = listener.connect_one();
  // A few bytes of a request, then nothing.
  ASSERT_EQ(::send(client, "\x03\x00", 2, 0), 2);
  const absl::Time start = absl::Now();
  EXPECT_EQ(guard->sweep(start).reset, 0);
  EXPECT_EQ(guard->sweep(start + kBound / 2).reset, 0);
  EXPECT_EQ(guard->sweep(start + kBound).reset, 1);
  // The client is told too.
  wait_readable(client);
  EXPECT_EQ(read_result(client), -ECONNRESET);
  ::close(client);
  ::close(server);
}

TEST(ListenerGuard, LeavesConnectionsTheProviderAnswered) {
  Listener listener;
  auto guard = ListenerGuard::for_name(listener.name(), kBound);
  ASSERT_NE(guard, nullptr);
  auto [client, server] = listener.connect_one();
  ASSERT_EQ(::send(server, "r", 1, 0), 1);  // the provider's answer
  char answer;
  ASSERT_EQ(::recv(client, &answer, 1, 0), 1);  // (unread, close would reset)
  ::close(client);
  wait_readable(server);
  const absl::Time now = absl::Now();
  EXPECT_EQ(guard->sweep(now).pending, 0);
  EXPECT_EQ(guard->sweep(now + 10 * kBound).reset, 0);
  EXPECT_EQ(read_result(server), 0);  // the client's end, not a reset
  ::close(server);
}

TEST(ListenerGuard, LeavesOtherListenersConnections) {
  Listener guarded;
  Listener other;
  auto guard = ListenerGuard::for_name(guarded.name(), kBound);
  ASSERT_NE(guard, nullptr);
  auto [client, server] = other.connect_one();
  ::close(client);
  wait_readable(server);
  EXPECT_EQ(guard->sweep(absl::Now() + 10 * kBound).pending, 0);
  EXPECT_EQ(read_result(server), 0);
  ::close(server);
}

// The provider's accepted sockets block; a request header that announces
// data which never comes must not hold its reader.
TEST(ListenerGuard, AcceptedSocketsInheritABoundOnReads) {
  Listener listener;
  auto guard = ListenerGuard::for_name(listener.name(), kBound);
  ASSERT_NE(guard, nullptr);
  auto [client, server] = listener.connect_one();
  timeval timeout{};
  socklen_t length = sizeof(timeout);
  ASSERT_EQ(::getsockopt(server, SOL_SOCKET, SO_RCVTIMEO, &timeout, &length),
            0);
  EXPECT_GT(absl::DurationFromTimeval(timeout), absl::ZeroDuration());
  EXPECT_LE(absl::DurationFromTimeval(timeout), absl::Milliseconds(100));
  char buffer[16];
  EXPECT_EQ(::recv(server, buffer, sizeof(buffer), 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  ::close(client);
  ::close(server);
}

}  // namespace
}  // namespace tether::backends::libfabric::internal
