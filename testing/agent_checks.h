// The sender's half of the agent conformance checks: what one agent sends to
// a peer and what it expects back.
//
// Shared by the in-process suite (testing/agent_conformance.cc), where the
// peer is another agent of the test process, and the cross-process suite
// (testing/agent_conformance_multiprocess.cc), where it lives in another
// process; the peer serves with the handler each check names
// (testing/agent_testing.h). Failures are gtest failures of the caller.
#ifndef TETHER_TESTING_AGENT_CHECKS_H_
#define TETHER_TESTING_AGENT_CHECKS_H_

#include "core/agent.h"
#include "core/future.h"
#include "core/message.h"
#include "testing/agent_testing.h"

namespace tether::testing {

// Peer: echo. A payload and storages of 100, 0 and 4096 bytes go and come
// back intact.
void expect_round_trip_with_storages(Agent& from, const WorkerInfo& to);

// Peer: echo. A 64 MiB storage goes and comes back intact.
void expect_large_storage_round_trip(Agent& from, const WorkerInfo& to);

// Peer: echo. Call number `i` of many in flight, with a 64-byte storage
// seeded by `i`; expect_call_echoed() checks its response.
Future<Message> send_call(Agent& from, const WorkerInfo& to, int i);
void expect_call_echoed(const Future<Message>& call, int i);

// Peer: refuse. The handler's code and text reach the sender.
void expect_handler_error(Agent& from, const WorkerInfo& to);

// A worker the transport does not know is UNAVAILABLE.
void expect_unknown_peer_unavailable(Agent& from);

// `agent` is rank `rank` of a group of `size` named "agent<rank>".
void expect_worker_infos(const Agent& agent, int rank, int size);

// Peer: holds, through `held`. A request that outlives its 200 ms timeout
// fails with DEADLINE_EXCEEDED; its late response is dropped and the next
// request succeeds.
void expect_timeout_then_working(Agent& from, const WorkerInfo& to,
                                 HeldControl& held);

// Peer: holds, through `held`; `from` has not sent to it yet. A request
// whose timeout (1 us) ends before it can have left (no connection to the
// peer exists yet) fails with DEADLINE_EXCEEDED and still reaches the
// peer's handler: a timeout ends the caller's wait, not the delivery, as in
// torch.distributed.rpc. Its late response is dropped; the next request
// succeeds.
void expect_timed_out_before_leaving_still_delivered(Agent& from,
                                                     const WorkerInfo& to,
                                                     HeldControl& held);

// Peer: holds, through `held`. shutdown() of `from` fails its 10 pending
// requests and every later send with CANCELLED; a second shutdown() is
// harmless. The held requests stay held: releasing them is the caller's.
void expect_shutdown_cancels(Agent& from, const WorkerInfo& to,
                             HeldControl& held);

// The limits (AgentSetup::limits) of the peer of
// expect_over_limits_refused(): 64 KiB of payload, 4 storages, 1 MiB of
// storage bytes.
MessageLimits small_limits();

// Peer: holds (through `held`), with small_limits(). While a request is held
// on the connection, requests over each of the peer's limits (payload bytes,
// storage count, storage bytes; small and 32 MiB large) fail with
// RESOURCE_EXHAUSTED naming the limit; the connection stays: the held
// request is then answered, and a request within the limits succeeds.
void expect_over_limits_refused(Agent& from, const WorkerInfo& to,
                                HeldControl& held);

// `caller` and `callee` have not started. `callee` shuts itself down from
// inside its handler, serving a request of `caller` (which succeeds or fails
// with UNAVAILABLE); later sends from `callee` fail with CANCELLED; nothing
// deadlocks (the check shuts `callee` down again at the end, which waits
// for the first).
void expect_shutdown_inside_handler_is_safe(Agent& caller, Agent& callee);

// Checks of the backends whose peers live apart (AgentTraits::remote_peers:
// tensorpipe, grpc, libfabric), which may reach an agent before it has
// started and see each other shut down (loopback does neither): the suite
// RemotePeerConformance of testing/agent_conformance.h.

// `sender` has started, `receiver` has not: a request with a 1 MiB storage
// is held until receiver.start(echo), then answered; a second start() is
// INVALID_ARGUMENT.
void expect_served_after_start(Agent& sender, Agent& receiver);

// Peer `to` holds requests (through `held`) and shuts down: the 3 requests
// `from` sent without a timeout fail promptly with UNAVAILABLE naming it,
// and so do later sends to it.
void expect_peer_shutdown_fails_pending(Agent& from, Agent& to,
                                        HeldControl& held);

}  // namespace tether::testing

#endif  // TETHER_TESTING_AGENT_CHECKS_H_
