// The faulty backend: an Agent that wraps another backend's agent and makes
// chosen message types fail, vanish or arrive late, for fault tests
// (docs/architecture.md section 2). Used by the tests of the layers above core
// (rref/rref_fault_test.cc) to check that their protocols survive lost and
// late messages; never by production code.
//
// Settings (AgentSetup::settings; TYPE is a name as message_type_name()
// prints it, e.g. RREF_USER_DELETE; a bad value or an unknown "faulty.*" key
// is INVALID_ARGUMENT naming the key). The other keys, faulty.* included,
// reach the inner backend unchanged.
//   faulty.inner         the wrapped backend's name in the registry (required;
//                        not "faulty" itself)
//   faulty.fail          TYPE:N[,TYPE:N...]: the first N sends of TYPE fail
//                        with UNAVAILABLE without being sent
//   faulty.drop          TYPE:N[,TYPE:N...]: the first N sends of TYPE go
//                        nowhere; only the sender's timeout ends them
//                        (DEADLINE_EXCEEDED). A dropped send without a
//                        timeout fails with DEADLINE_EXCEEDED after
//                        faulty.drop_bound_ms instead, so nothing hangs
//                        forever.
//   faulty.drop_bound_ms that bound, in milliseconds (default 10000)
//   faulty.jitter_ms     N: every send that is neither failed nor dropped
//                        waits a further random 0..N ms (uniform), so
//                        messages overtake each other (soak tests)
//   faulty.delay         TYPE:MILLIS[,TYPE:MILLIS...]: every send of TYPE
//                        that is sent waits MILLIS first. The sender's
//                        timeout counts from send(): a delay that outlasts it
//                        fails the send with DEADLINE_EXCEEDED at the
//                        timeout, and the message still leaves after MILLIS
//                        (a timeout ends the sender's wait, not the
//                        delivery, as on every agent); its answer is
//                        dropped.
// Each agent counts its own sends: with faulty.fail=PING:1, the first PING
// of every worker fails. A send uses up a fail first, then a drop; only a
// send that is neither failed nor dropped is delayed. Responses are never
// touched: a fault hits the request that carries the type.
//
// Everything else (start, the request handler, worker_infos, shutdown) is
// the inner agent's. join() first waits, within its timeout, for the sends
// this agent holds (dropped or delayed) to end, then joins the inner agent:
// a request held here is in flight as much as one on the wire. A request
// first sent (from a callback) after this worker's inner join began is not
// waited for. shutdown() fails the held sends with CANCELLED, then shuts the
// inner agent down.
//
// Threads: failed sends complete at once (a ready future, as an agent's
// refused sends do); dropped and delayed ones complete on this agent's timer
// thread or on the inner agent's threads. WARNING: as with loopback, the
// agent must not be destroyed from a callback that runs on its timer thread
// (its destructor joins that thread).
#ifndef TETHER_BACKENDS_FAULTY_FAULTY_AGENT_H_
#define TETHER_BACKENDS_FAULTY_FAULTY_AGENT_H_

#include <cstdint>

#include "core/backend_registry.h"

namespace tether::backends {

// The backend named "faulty", for a BackendRegistry. It finds the backend it
// wraps (faulty.inner) in `inner_backends` each time it creates an agent.
// WARNING: `inner_backends` is borrowed; it must outlive every use of the
// returned Backend (it is usually the registry the faulty backend itself is
// added to). The agents it makes do not refer to it.
Backend faulty_backend(const BackendRegistry* inner_backends);

// The faults every faulty agent of this process has injected so far, for
// tests that report them. Thread-safe.
struct InjectedFaults {
  int64_t failed = 0;
  int64_t dropped = 0;
  int64_t delayed = 0;
};
InjectedFaults injected_faults();

}  // namespace tether::backends

#endif  // TETHER_BACKENDS_FAULTY_FAULTY_AGENT_H_
