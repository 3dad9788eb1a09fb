// The tensorpipe backend: agents that talk through libtensorpipe, the
// default multi-process transport of tether (docs/architecture.md section 2).
//
// Each agent owns one tensorpipe::Context with the transport tcp (tether's
// own, internal/tcp_transport.h) and the channels basic and cma
// (cross-memory attach), registered with priorities so that TensorPipe
// negotiates the best pair per peer: tcp + cma between processes of one
// host, tcp + basic across hosts. The mpt channel (several TCP lanes, each
// one a tcp transport of ours, for bandwidth across hosts) is opt-in: its
// lanes listen and run a thread each in every worker whether or not a peer
// uses them. A transport or channel that is not viable on this machine is
// skipped.
//
// File descriptors: a TensorPipe pipe holds two connections of its own
// (descriptors, descriptor replies) plus its CPU channel's (cma 2, basic 1,
// mpt 1 + one per lane), and a pair of workers shares one pipe (below): 4
// sockets per peer on one host (docs/benchmarks.md, "Scale").
//
// Strangers: TensorPipe's own transports parse whatever reaches
// their sockets and abort the process on bad bytes (16 bytes of 0xff on a uv
// port: std::bad_alloc on its loop thread; a shm connection that sends no
// file descriptors crashes it too). tether's tcp transport runs a bounded
// handshake (magic, both names in the group, and the shared secret both
// ways when there is one) before TensorPipe sees a connection, and checks
// every frame's length before allocating. TensorPipe's "uv" and "shm" can
// still be chosen (tensorpipe.transports); then their sockets are exposed
// as docs/security.md says.
//
// At creation the agent listens, publishes its listener's addresses in the
// group's store under "tether/tensorpipe/<rank>" and waits until every rank
// has published. Pipes open lazily on the first send to a peer, and a
// pipe carries both ways: a worker that has accepted a peer's pipe (once
// authenticated, when there is a secret) sends its own requests on it
// instead of opening another; when two workers open a pipe to each other at
// once, the one the lower rank opened carries both ways and the higher rank
// closes its own once its requests on it are answered. Each response goes
// back on the pipe its request came on. A broken pipe fails the requests
// pending on it with UNAVAILABLE and is dropped, so the next send
// reconnects. When
// tensorpipe fails the listener (it does so when an incoming connection dies
// before its first packet, e.g. a peer crashing while it connects), the
// agent listens again on the addresses it published.
//
// Settings (AgentSetup::settings; an unknown "tensorpipe.*" key or a bad
// value is INVALID_ARGUMENT):
//   tensorpipe.transports     comma list of "tcp", "uv", "shm" (default
//                             "tcp"; "uv" and "shm" are TensorPipe's own,
//                             unguarded: docs/security.md)
//   tensorpipe.channels       comma list of "basic", "cma", "cma_write",
//                             "mpt", "xth" (default "basic,cma_write":
//                             within a host the sender writes into the
//                             receiver's buffer, internal/cma_write_channel.h;
//                             "cma" is TensorPipe's, the receiver reading;
//                             xth only helps
//                             agents of one process, and is for tests:
//                             TensorPipe's xth copies on the receiving
//                             agent's thread straight from the sender's
//                             memory, and a sender that shuts down with such
//                             a copy under way is told its write failed
//                             before the copy ends, so the storage can be
//                             freed under it; seen once under TSan, where a
//                             1 MiB request outlived its 30 s bound)
//   tensorpipe.mpt_lanes      TCP lanes of the mpt channel, 1..64 (default 2)
//   tensorpipe.address        IP address or network interface to listen on
//                             (default: the address every backend chooses,
//                             core/host_address.h)
//   tensorpipe.init_timeout_ms  how long creation waits for every rank's
//                             address (default 60000)
//   tensorpipe.handshake_timeout_ms  how long a new tcp connection has to
//                             finish tether's handshake before it is closed
//                             (default 10000)
//
// Authentication (AgentSetup::auth, from RpcOptions::auth_secret or
// TETHER_AUTH_SECRET): on the tcp transport, every connection (pipes and
// mpt lanes) runs the challenge-response of core/auth in its handshake,
// before TensorPipe reads from it; a refusal there fails the peer's calls
// with UNAUTHENTICATED and the reason. Then, on every transport, on each new
// pipe both ends send a random challenge
// (an auth frame, internal/framing.h) and answer the other's with an
// HMAC-SHA256 proof (core/auth). The client holds its requests until it has
// answered and takes no response before the server has; the server reads no
// request before the client's proof checks out. A peer that fails, or has
// no secret when this agent has one (or the reverse), gets a refusal with
// the reason and its connection is closed; the refusal is logged, and the
// peer's calls fail with UNAUTHENTICATED. Nothing is encrypted: the
// transports carry plain bytes (docs/security.md).
//
// Threads: tensorpipe's own threads run the request handler and complete
// send() futures. A caller's thread writes into an open pipe itself; the
// agent adds an io thread that opens pipes, writes what arrives while one
// is being set up and runs the callbacks tensorpipe queued on a caller's
// thread (docs/decisions.md, "Threads of a small call"), and one timer
// thread. join() is the store barrier of core/join. The tcp transport's
// poller keeps polling for AgentSetup::busy_poll after the last descriptor
// it found ready before it sleeps in epoll_wait (yielding its core between
// polls); TensorPipe's shm transport always polls, its uv transport never.
#ifndef TETHER_BACKENDS_TENSORPIPE_TENSORPIPE_AGENT_H_
#define TETHER_BACKENDS_TENSORPIPE_TENSORPIPE_AGENT_H_

#include "core/backend_registry.h"

namespace tether::backends {

// The backend named "tensorpipe", for a BackendRegistry.
Backend tensorpipe_backend();

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_TENSORPIPE_TENSORPIPE_AGENT_H_
