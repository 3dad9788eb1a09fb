// The gRPC backend: agents that talk over gRPC (Debian's gRPC C++ 1.51, the
// async API on completion queues the agent drives), for clusters where gRPC is the transport that is allowed,
// proxied or secured (TLS, mutual TLS). docs/architecture.md section 2.
//
// At creation the agent starts a gRPC server with one generic method,
// "/tether.Agent/Stream", publishes its "host:port" in the group's store
// under "tether/grpc/<rank>" and waits until every rank has published. The
// first send to a peer opens one bidirectional stream to it (a channel of
// its own, then a generic call); the peer learns who called from the call's
// metadata. Requests and responses of both workers travel on that stream,
// multiplexed by id: the peer sends its own requests on it too, so a pair of
// workers shares one stream (two, briefly, if both open at once: both are
// used). Messages go as frames (internal/framing.h): small buffers copied
// into the head, large ones as gRPC slices that reference the tensor
// storage, in chunks taken round robin between the messages queued on a
// stream, so a large message does not hold up small ones behind it.
//
// Authentication (core/auth), when the group shares a secret
// (RpcOptions::auth_secret or TETHER_AUTH_SECRET): on every stream, before
// any message, each side sends a hello frame with its name and a fresh
// challenge, answers the other's hello with a proof frame (HMAC-SHA256 over
// both challenges, both names and its role; the secret never travels) and
// checks the other's proof. A side sends messages only once it has checked
// the peer's proof, and accepts none before: a frame other than the
// handshake is refused before anything is allocated for it. A refusal (no
// secret on one side, a wrong proof, a name that is not the stream's, no
// proof within grpc.auth_timeout_ms) is logged on the refusing side and ends the stream;
// its requests fail with UNAUTHENTICATED and the reason (a server tells
// the client why in the stream's status; a client can only cancel). The
// call metadata (who opens the stream) is only a claim until then.
// Requests queued on a stream that ends before its handshake finished never
// left; they get one more stream (the two ends of a pair can refuse each
// other's streams at once, and one may see its stream cancelled before it
// learns why), whose handshake reports the refusal if there is one.
//
// A stream that ends (the peer closed it, crashed, or stopped answering
// keepalive pings) fails the requests that left on it with UNAVAILABLE and
// is dropped with its channel; the next send opens a new one. A message over
// the size limit fails with RESOURCE_EXHAUSTED on the side that notices it
// (a refused request is answered with that error as soon as its head
// arrives; the bytes that follow are skipped), and the stream goes on. Bytes
// that break the framing, such as a head announcing more than any agent may
// send (2^40 bytes), end the stream at once: they are a stranger's
// (docs/security.md).
//
// Settings (AgentSetup::settings; an unknown "grpc.*" key or a bad value is
// INVALID_ARGUMENT naming the key):
//   grpc.address          IP address, "[IPv6]" or network interface to listen
//                         on, optionally ":port" (default: the address every
//                         backend chooses, core/host_address.h, and a port
//                         the kernel picks); peers connect to it as
//                         published, so it must be reachable (not 0.0.0.0)
//   grpc.tls_cert         PEM certificate chain of this worker      \ TLS on
//   grpc.tls_key          PEM private key of that certificate        | when
//   grpc.tls_ca           PEM CA certificates that sign the peers'  / all set
//   grpc.tls_mutual       "on" (default) or "off": servers require and verify
//                         client certificates
//   grpc.tls_server_name  the name checked in peers' server certificates
//                         (default: their IP address, as published)
//   grpc.keepalive_ms     interval of HTTP/2 keepalive pings on idle
//                         connections, 0 = none (default 10000)
//   grpc.keepalive_timeout_ms  a ping unanswered this long loses the peer
//                         (default 5000, or the peer timeout if that is
//                         longer): a silent peer is detected within
//                         keepalive_ms + keepalive_timeout_ms
//   grpc.completion_threads  completion queues of the agent's streams, each
//                         with a thread of the agent that drives it, runs
//                         the request handler and completes send()
//                         futures, 1..64 (default 1)
//   grpc.max_message_bytes  largest message (payload and storages) sent or
//                         accepted (default 2 GiB)
//   grpc.chunk_bytes      largest piece of a large buffer per frame, 4 KiB to
//                         64 MiB (default 1 MiB); gRPC's own per-message limit
//                         is set from it (not left at its 4 MiB default)
//   grpc.init_timeout_ms  how long creation waits for every rank's address
//                         (default 60000)
//   grpc.auth_timeout_ms  with a shared secret: a stream whose peer has not
//                         proven it this long after the stream began is
//                         refused (default 20000)
//
// Threads: the agent's queue threads drive its completion queues (gRPC's
// async API: each stream's operations complete on one of them, in order),
// run the request handler and complete send() futures; one task thread runs
// requests that arrived before start() and deletes ended streams; one timer
// thread bounds requests. gRPC's own threads (timers, name resolution) carry
// no message. join() is
// the store barrier of core/join. The Agent's methods may be called from any
// thread, shutdown() included from the handler or a future's callback (the
// joins then finish on a thread of their own).
//
// Ownership: a request's storages are referenced, not copied, until gRPC has
// written them (core/message.h: do not write to them meanwhile). Received
// storages own their memory: bytes copied out of gRPC's slices (at most
// 64 KiB each, so a storage cannot adopt them) into blocks that storages of
// 2 MiB and more take from the process-wide cache of the buffers of freed
// received storages (core/toolkit/receive_buffers.h: up to 256 MiB). The
// first agent made holds gRPC initialised for the rest of the process (see
// docs/decisions.md).
#ifndef TETHER_BACKENDS_GRPC_GRPC_AGENT_H_
#define TETHER_BACKENDS_GRPC_GRPC_AGENT_H_

#include "core/backend_registry.h"

namespace tether::backends {

// The backend named "grpc", for a BackendRegistry.
Backend grpc_backend();

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_GRPC_GRPC_AGENT_H_
