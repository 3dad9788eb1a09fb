// tether's TCP transport for TensorPipe (internal to the tensorpipe
// backend; docs/security.md says what it guards against).
//
// TensorPipe's own uv transport reads a peer's 8-byte length prefix and
// allocates what it announces, and its pipe parses the first bytes of any
// connection with libnop, throwing on malformed ones: one connection
// carrying 16 bytes of 0xff ends the process (std::bad_alloc on the uv loop
// thread). This transport is registered with TensorPipe in its place (as
// "tcp", and for the mpt channel's lanes) and guards every connection:
//
//   - Before a connection is handed to TensorPipe (the listener's accept
//     callback, or the first read or write of a connecting one), both ends
//     run the handshake of tcp_handshake.h within `handshake_timeout`:
//     tether's magic and version, both names members of the group, and with
//     a shared secret (core/auth) a challenge-response both ways. A stranger
//     never reaches TensorPipe's parser; what it sends is read only into a
//     bounded buffer. A refusal is logged on the refusing side (rate
//     limited), sent to the peer as a reason, and fails the peer's
//     connection with a RefusedError.
//   - After it, every frame's announced length is checked before anything
//     is allocated: a read of known size takes only a frame of exactly that
//     size, a read of unknown size (TensorPipe's control messages) at most
//     `max_unsized_read_bytes`. A malformed TensorPipe control message
//     closes that connection (TensorPipe's own transports throw, ending the
//     process). Either way the reason is logged and the connection closed.
//   - At most kMaxHandshakes connections handshake at once per listener;
//     more wait in the kernel's backlog until one ends. Every socket a refused or failed connection
//     held is closed when it fails.
//   - Writes use MSG_NOSIGNAL: a peer that went away is an error on that
//     connection, never a SIGPIPE.
//
// Wire format after the handshake: each write is its length (u64, host
// order) then its bytes, as TensorPipe's uv transport frames them, or an
// express frame (kExpressBit, below); peers are tether workers of one
// build.
//
// Addresses: listen on "ip" or "ip:port" (IPv6 in brackets; port 0 or none
// picks a free one); the listener's address, and what connect() takes, is
// "ip:port".
//
// Threads: a thread that writes sends its bytes itself when no other
// thread is running the transport's work; one poller thread per context
// waits on the sockets and reads (tcp_transport_context.h). Callbacks into
// TensorPipe run on whichever of these is running the work, never two at
// once.
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_H_

#include <absl/strings/string_view.h>
#include <absl/time/time.h>
#include <sys/socket.h>
#include <tensorpipe/common/error.h>
#include <tensorpipe/transport/context.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/auth/auth.h"
#include "core/toolkit/poll_policy.h"

namespace tether::backends::tensorpipe::internal {

inline constexpr size_t kMaxHandshakes = 64;

namespace tcp {
class ConnectionImpl;
}  // namespace tcp

// Express frames: a frame whose length word has its top bit set is not
// TensorPipe's. The connection hands it whole to the context's sink, in the
// loop, between TensorPipe's frames (never inside one), and TensorPipe
// never sees it. The agent sends its small messages so, beside the pipe the
// connection carries, skipping the pipe's machinery (its operations, its
// control messages, their callbacks and allocations): about a third of a
// small call's instructions (docs/decisions.md, "Small messages skip
// TensorPipe's pipe"). Its length is checked against
// `max_unsized_read_bytes` as TensorPipe's control messages are; the frame
// is only read once it is all there. The bytes are valid during the call.
inline constexpr uint64_t kExpressBit = uint64_t{1} << 63;
// The largest express frame.
inline constexpr size_t kMaxExpressBytes = 128 << 10;
using ExpressSink = std::function<void(
    const std::shared_ptr<tcp::ConnectionImpl>& connection,
    absl::string_view frame)>;

// Queues `frame` as one express frame on `connection` (any thread; sent as
// TensorPipe's writes are). Dropped if the connection has failed: whoever
// waits for an answer learns it from the pipe's error.
void write_express(const std::shared_ptr<tcp::ConnectionImpl>& connection,
                   std::string frame);
// Fails `connection` (any thread), logging `why`: a peer broke the express
// protocol.
void fail_express(const std::shared_ptr<tcp::ConnectionImpl>& connection,
                  std::string why);
// The name the peer of `connection` gave in the handshake (authenticated
// when the group has a secret). Set once the connection is established.
std::string express_peer(const tcp::ConnectionImpl& connection);

// The first connection ::tensorpipe::Context::connect() opens on this thread
// (the new pipe's own, which its messages travel on), when it is one of
// this transport's. Open a scope, connect, then take() it: nullptr if the
// pipe's connection is another transport's.
class OpenedConnection {
 public:
  OpenedConnection();
  ~OpenedConnection();
  OpenedConnection(const OpenedConnection&) = delete;
  OpenedConnection& operator=(const OpenedConnection&) = delete;

  std::shared_ptr<tcp::ConnectionImpl> take();
};

struct TcpTransportOptions {
  // This worker's name, sent in the handshake.
  std::string self;
  // The names that may connect or be connected to (the group).
  std::vector<std::string> members;
  // The group's secret; nullopt: no authentication.
  std::optional<auth::Authenticator> auth;
  // The largest frame a read of unknown size accepts.
  size_t max_unsized_read_bytes = size_t{64} << 20;
  // How long a connection accepted here may take to complete the handshake
  // (what a stranger that connects and says nothing costs).
  absl::Duration handshake_timeout = absl::Seconds(10);
  // How long a connection opened here may take, from connect() to the end
  // of the handshake. It includes the wait in a busy peer's backlog and for
  // a core (64 workers on 2 cores came up, but 10 s was too short for
  // hundreds of connections at once): the agent sets its peer timeout,
  // the bound of a peer that is alive.
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long the poller keeps polling without sleeping after it last found
  // a descriptor ready (yielding its core between polls), and whether only
  // on spare cores; the default: it sleeps in epoll_wait at once.
  PollPolicy poll = PollPolicy();
  // Starts every log line, e.g. "tensorpipe agent of worker 'w0'".
  std::string log_prefix = "tensorpipe tcp transport";
  // Takes the express frames that arrive (below); null: an express frame
  // fails its connection.
  ExpressSink express_sink;
};

// The error of a connection refused by either end's handshake; what() is
// the reason, naming the refusing worker.
class RefusedError final : public ::tensorpipe::BaseError {
 public:
  explicit RefusedError(std::string reason) : reason_(std::move(reason)) {}
  std::string what() const override { return reason_; }

 private:
  std::string reason_;
};

// The domain descriptor of every such transport: any two can connect.
inline constexpr char kTcpDomainDescriptor[] = "tether-tcp:1";

std::shared_ptr<::tensorpipe::transport::Context> create_tcp_transport(
    TcpTransportOptions options);

// The transport sends the writes made in one turn of its loop together,
// once the loop has no task left (tcp_transport_context.h). A thread that
// is not in the loop enters it for each write, so a pipe's message of
// several writes (its descriptor, then each payload) would leave in one
// sendmsg() each. While one of these is alive on a thread, the writes this
// thread makes in the loop are queued on their connections and sent when
// it ends, one sendmsg() per connection: the message leaves in one segment
// instead of one each, and the peer is woken once for it, not once per
// write. Writes the loop runs on another thread (one that was in it
// already) go out with that thread's turn. Not nested: an inner one does
// nothing.
class GatheredWrites {
 public:
  GatheredWrites();
  ~GatheredWrites();
  GatheredWrites(const GatheredWrites&) = delete;
  GatheredWrites& operator=(const GatheredWrites&) = delete;

  // The one gathering on this thread, or null.
  static GatheredWrites* current();
  // `connection` has writes queued for this one to send.
  void add(std::shared_ptr<tcp::ConnectionImpl> connection);

 private:
  bool active_ = false;
  std::vector<std::shared_ptr<tcp::ConnectionImpl>> connections_;
};

// "ip", "ip:port", "[ip6]" or "[ip6]:port" (port 0 when absent) as a socket
// address; false if it is none.
bool parse_socket_address(const std::string& text, sockaddr_storage* storage,
                          socklen_t* length);

}  // namespace tether::backends::tensorpipe::internal

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_H_
