// The tensorpipe backend, the default multi-process one: agents that talk
// through libtensorpipe over tether's guarded tcp transport, one pipe per
// pair of workers, tensors within a host written straight into the
// receiver's memory (cma_write). How it connects and carries messages:
// docs/architecture.md section 2, "How each backend connects"; what its
// handshake and authentication protect: docs/security.md.
//
// Settings (AgentSetup::settings; an unknown "tensorpipe.*" key or a bad
// value is INVALID_ARGUMENT):
//   tensorpipe.transports     comma list of "tcp", "uv", "shm" (default
//                             "tcp"; "uv" and "shm" are TensorPipe's own,
//                             unguarded: docs/security.md)
//   tensorpipe.channels       comma list of "basic", "cma", "cma_write",
//                             "mpt", "xth" (default "basic,cma_write"; "xth"
//                             only for agents of one process, in tests)
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
// Authentication (AgentSetup::auth): every connection and every pipe proves
// the shared secret before a message; a peer that fails has its calls fail
// with UNAUTHENTICATED and the reason. Nothing is encrypted.
//
// Threads: TensorPipe's own threads run the request handler and complete
// send() futures; the agent adds an io thread (opening pipes) and a timer
// thread (docs/architecture.md section 8). The tcp transport's poller
// spins for AgentSetup::busy_poll before it sleeps.
#ifndef TETHER_BACKENDS_TENSORPIPE_TENSORPIPE_AGENT_H_
#define TETHER_BACKENDS_TENSORPIPE_TENSORPIPE_AGENT_H_

#include "core/backend_registry.h"

namespace tether::backends {

// The backend named "tensorpipe", for a BackendRegistry.
Backend tensorpipe_backend();

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_TENSORPIPE_TENSORPIPE_AGENT_H_
