// The loopback backend: agents of one process, connected in memory.
//
// For fast, deterministic tests of everything above core (several Workers in
// one test process). Agents whose AgentSetup has the same group_key reach each
// other. It behaves like a wire: every storage is copied on the way (a callee
// never aliases its caller's tensors), each agent has its own event thread,
// and responses, timeouts and shutdown follow the Agent contract.
#ifndef TETHER_BACKENDS_LOOPBACK_LOOPBACK_AGENT_H_
#define TETHER_BACKENDS_LOOPBACK_LOOPBACK_AGENT_H_

#include "core/backend_registry.h"

namespace tether::backends {

// The backend named "loopback", for a BackendRegistry.
Backend loopback_backend();

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_LOOPBACK_LOOPBACK_AGENT_H_
