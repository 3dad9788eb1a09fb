#include "testing/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

namespace tether::testing {
namespace {

// The lowest port of the kernel's ephemeral range (32768 if unreadable,
// Linux's default).
int ephemeral_low() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (range >> low >> high && low > 0) return low;
  return 32768;
}

// Binds a loopback TCP socket to `port` (0: the kernel picks) and returns
// the bound port, or -1.
int bind_port(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  int bound = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

}  // namespace

int pick_unused_port() {
  // Candidates from 10000 up to the ephemeral range; a range too small for
  // that (a tuned kernel) falls back to the kernel's pick.
  constexpr int kFirst = 10000;
  const int end = ephemeral_low();
  if (end - kFirst >= 1000) {
    std::random_device seed;
    std::mt19937 random(seed());
    std::uniform_int_distribution<int> pick(kFirst, end - 1);
    for (int attempt = 0; attempt < 100; ++attempt) {
      const int port = bind_port(pick(random));
      if (port > 0) return port;
    }
  }
  return bind_port(0);
}

}  // namespace tether::testing
