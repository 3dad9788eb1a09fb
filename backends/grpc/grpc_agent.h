// The gRPC backend: agents that talk over gRPC (Debian's gRPC C++, the
// async API on completion queues the agent drives), one bidirectional
// stream per pair of workers, for clusters where gRPC is the transport that
// is allowed, proxied or secured (TLS, mutual TLS). How it connects and
// carries messages: docs/architecture.md section 2, "How each backend
// connects"; its authentication handshake and TLS: docs/security.md.
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
//                         with a thread of the agent that drives it, 1..64
//                         (default 1)
//   grpc.max_message_bytes  largest message (payload and storages) sent or
//                         accepted (default 2 GiB)
//   grpc.chunk_bytes      largest piece of a large buffer per frame, 4 KiB to
//                         64 MiB (default 1 MiB); gRPC's own per-message limit
//                         is set from it
//   grpc.init_timeout_ms  how long creation waits for every rank's address
//                         (default 60000)
//   grpc.auth_timeout_ms  with a shared secret: a stream whose peer has not
//                         proven it this long after the stream began is
//                         refused (default 20000)
//
// Threads: the agent's queue threads drive its completion queues, run the
// request handler and complete send() futures; a task thread and a timer
// thread do the rest; gRPC's own threads carry no message (docs/
// architecture.md section 8). shutdown() may be called from the handler or
// a future's callback.
//
// Ownership: a request's storages are referenced, not copied, until gRPC has
// written them (core/message.h: do not write to them meanwhile).
#ifndef TETHER_BACKENDS_GRPC_GRPC_AGENT_H_
#define TETHER_BACKENDS_GRPC_GRPC_AGENT_H_

#include "core/backend_registry.h"

namespace tether::backends {

// The backend named "grpc", for a BackendRegistry.
Backend grpc_backend();

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_GRPC_GRPC_AGENT_H_
