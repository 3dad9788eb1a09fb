#include "backends/libfabric/internal/listener_guard.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/numbers.h>
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

namespace tether::backends::libfabric::internal {
namespace {

// States of tcp_info::tcpi_state (the kernel's include/net/tcp_states.h,
// which user space does not get).
constexpr uint8_t kTcpClose = 7;
constexpr uint8_t kTcpCloseWait = 8;

// How long the provider's read of a connection request may wait for bytes
// that have not come (see the header).
constexpr absl::Duration kReadBound = absl::Milliseconds(10);

// Disconnects `fd`: the kernel resets the connection, and the socket's
// next read fails with ECONNRESET.
void disconnect(int fd) {
  sockaddr unspecified{};
  unspecified.sa_family = AF_UNSPEC;
  ::connect(fd, &unspecified, sizeof(unspecified));
}

// Gives the listener `fd` a receive timeout of kReadBound, which the
// sockets it accepts inherit (the kernel clones them from it), unless it
// has one already.
void bound_reads(int fd) {
  timeval timeout{};
  socklen_t length = sizeof(timeout);
  if (::getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, &length) == 0 &&
      (timeout.tv_sec != 0 || timeout.tv_usec != 0)) {
    return;
  }
  timeout = absl::ToTimeval(kReadBound);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
}

}  // namespace

std::unique_ptr<ListenerGuard> ListenerGuard::for_name(const std::string& name,
                                                       absl::Duration bound) {
  sockaddr_storage address{};
  if (name.size() < sizeof(sa_family_t) || name.size() > sizeof(address)) {
    return nullptr;
  }
  std::memcpy(&address, name.data(), name.size());
  if (!(address.ss_family == AF_INET && name.size() >= sizeof(sockaddr_in)) &&
      !(address.ss_family == AF_INET6 &&
        name.size() >= sizeof(sockaddr_in6))) {
    return nullptr;
  }
  auto guard =
      std::unique_ptr<ListenerGuard>(new ListenerGuard(address, bound));
  guard->sweep(absl::Now());  // bounds the listener's reads at once
  return guard;
}

bool ListenerGuard::is_ours(const sockaddr_storage& local) const {
  if (local.ss_family != address_.ss_family) return false;
  if (local.ss_family == AF_INET) {
    const auto& mine = reinterpret_cast<const sockaddr_in&>(address_);
    const auto& theirs = reinterpret_cast<const sockaddr_in&>(local);
    return mine.sin_port == theirs.sin_port &&
           (mine.sin_addr.s_addr == htonl(INADDR_ANY) ||
            mine.sin_addr.s_addr == theirs.sin_addr.s_addr);
  }
  const auto& mine = reinterpret_cast<const sockaddr_in6&>(address_);
  const auto& theirs = reinterpret_cast<const sockaddr_in6&>(local);
  return mine.sin6_port == theirs.sin6_port &&
         (IN6_IS_ADDR_UNSPECIFIED(&mine.sin6_addr) ||
          std::memcmp(&mine.sin6_addr, &theirs.sin6_addr,
                      sizeof(in6_addr)) == 0);
}

ListenerGuard::Swept ListenerGuard::sweep(absl::Time now) {
  Swept swept;
  absl::flat_hash_set<uint64_t> present;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return swept;
  const int own = ::dirfd(dir);
  while (dirent* entry = ::readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == own) continue;
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
        !is_ours(local)) {
      continue;
    }
    int listening = 0;
    length = sizeof(listening);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) !=
        0) {
      continue;
    }
    if (listening != 0) {
      bound_reads(fd);
      continue;
    }
    tcp_info info{};
    length = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) {
      continue;
    }
    // Answered by the provider: a connection it has taken on (or refused).
    if (info.tcpi_bytes_sent > 0) continue;
    const uint64_t inode = st.st_ino;
    present.insert(inode);
    ++swept.pending;
    const absl::Time seen = first_seen_.try_emplace(inode, now).first->second;
    // Disconnected by an earlier sweep: the provider has yet to look.
    if (info.tcpi_state == kTcpClose) continue;
    const bool client_gone = info.tcpi_state == kTcpCloseWait;
    if (client_gone || now - seen >= bound_) {
      disconnect(fd);
      ++swept.reset;
    }
  }
  ::closedir(dir);
  absl::erase_if(first_seen_, [&present](const auto& entry) {
    return !present.contains(entry.first);
  });
  return swept;
}

}  // namespace tether::backends::libfabric::internal
