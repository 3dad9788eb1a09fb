// ListenerGuard: keeps strangers' connections to libfabric's tcp provider
// from piling up (docs/security.md; internal to the libfabric backend).
//
// Under tcp;ofi_rxm the endpoint listens on a TCP port, and libfabric 1.17's
// tcp provider accepts every connection there and waits for its connection
// request (a control header and up to 256 bytes of data) with no time
// limit. Two of its paths never let go of the socket:
//   - a request cut short (the client closes before or inside it, or a
//     header that announces more data than comes): recv() returns 0 or
//     less than asked, and the provider takes a stale errno of EAGAIN for
//     "try later", so the socket stays, in CLOSE_WAIT once the client has
//     gone, for the life of the endpoint (300 connect/close cycles left 300
//     descriptors: docs/security.md);
//   - a client that connects and sends nothing, or part of a request, is
//     held as long as it likes;
//   - the sockets it accepts are blocking, and a header that announces
//     connection data which does not come blocks the provider, and so the
//     agent's progress thread, in recv() until the client sends more or
//     leaves (a stranger stalled every call of the worker for 5 s).
// The guard finds those sockets, the provider's own, and makes the
// provider close them itself: it disconnects each (connect() with
// AF_UNSPEC: the kernel resets the connection), after which the provider's
// next look at it gets ECONNRESET, a real error, and it closes the socket
// and frees what it held. A socket is the provider's if it is accepted on
// the endpoint's address; it is still in the request stage if the provider
// has sent nothing on it (every request the provider accepts or refuses is
// answered). Such a socket is disconnected once its client has closed its
// side, or once it has been seen for `bound` (a real peer's provider sends
// its request as soon as it connects). Connections the provider has
// answered are never touched. And the guard gives the listening socket a
// receive timeout of 10 ms, which the kernel copies to every socket it
// accepts: a read of a request whose bytes have not come then fails with
// EAGAIN after 10 ms, which the provider takes for "try later", instead of
// blocking (a real peer sends its header and data in one send()). Once the
// provider takes a connection on it makes the socket non-blocking, where
// the timeout has no effect.
//
// Thread safety: call sweep() from the thread that drives the provider
// (the agent's progress thread), between libfabric calls: the provider
// only closes its sockets inside those calls, so a descriptor found by
// sweep() stays the same socket until it returns.
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_LISTENER_GUARD_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_LISTENER_GUARD_H_

#include <absl/container/flat_hash_map.h>
#include <absl/time/time.h>
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>

namespace tether::backends::libfabric::internal {

class ListenerGuard {
 public:
  // A guard of the TCP listener at `name` (the endpoint's fi_getname: a
  // sockaddr_in or sockaddr_in6), or nullptr if `name` is not one (shm and
  // other providers that do not listen on TCP).
  static std::unique_ptr<ListenerGuard> for_name(const std::string& name,
                                                 absl::Duration bound);

  // What one sweep found.
  struct Swept {
    int pending = 0;  // connections still in the request stage
    int reset = 0;    // of them, disconnected now
  };

  // Looks at every socket of the process once.
  Swept sweep(absl::Time now);

 private:
  ListenerGuard(const sockaddr_storage& address, absl::Duration bound)
      : address_(address), bound_(bound) {}

  // Whether `local` (a socket's own address) is the listener's: same
  // family and port, and same IP unless the listener's is a wildcard.
  bool is_ours(const sockaddr_storage& local) const;

  const sockaddr_storage address_;
  const absl::Duration bound_;
  // Sockets in the request stage, by inode: when first seen.
  absl::flat_hash_map<uint64_t, absl::Time> first_seen_;
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_LISTENER_GUARD_H_
