// Refusals: how every agent (loopback, faulty, tensorpipe, gRPC, libfabric)
// refuses a send() before anything leaves, in one wording.
//
// core/agent.h promises that a send's future never completes inside
// send(): a caller may hold a lock its callbacks take. A refused send
// therefore completes on another thread: the one refusal thread of the
// process, which runs nothing else and lives until the process exits.
//
// Thread safety: every function may be called from any thread.
#ifndef TETHER_BACKENDS_COMMON_REFUSALS_H_
#define TETHER_BACKENDS_COMMON_REFUSALS_H_

#include <absl/status/status.h>
#include <absl/strings/string_view.h>

#include <functional>
#include <string>

#include "core/future.h"
#include "core/message.h"

namespace tether::backends::common {

// A future that fails with `status` (not OK) on the refusal thread, never
// inline: what send() returns when it refuses.
Future<Message> refused(absl::Status status);

// Runs `task` on the refusal thread, after every task posted before it:
// for an agent that must fail a request it has already registered (its
// future is out) without completing it inside send(). `task` must not
// block.
void on_refusal_thread(std::function<void()> task);

// The error of a send() after shutdown (CANCELLED), naming both workers.
absl::Status sent_after_shutdown(absl::string_view self_name, MessageType type,
                                 absl::string_view to);

// The error of a send() to a worker the agent does not know (UNAVAILABLE).
absl::Status not_in_group(absl::string_view self_name, absl::string_view to);

// What the requests still pending at shutdown fail with (CANCELLED).
absl::Status shut_down_with_request_pending(absl::string_view self_name);

// Lost, left, closed: how the multi-process agents word what a peer's
// going does to the calls that wait on it, so that a caller reads the same
// words whichever backend carried the call. A peer is named by
// describe_peer(): "worker 'p' (rank r)", or "the worker of rank r" once
// its name is no longer known ("" for `peer_name`).
std::string describe_peer(absl::string_view peer_name, int rank);

// UNAVAILABLE, "worker 'p' (rank r) is lost: <why>": the peer died or fell
// silent (the liveness checks; core/join's probe words it the same way).
absl::Status peer_lost(absl::string_view peer_name, int rank,
                       absl::string_view why);

// UNAVAILABLE, "worker 'p' (rank r) has left the group of worker 's'": a
// request to a peer that left a dynamic group before it went out.
absl::Status peer_left(absl::string_view self_name, absl::string_view peer_name,
                       int rank);

// UNAVAILABLE, "worker 'p' (rank r) has shut down (worker 's' was told)":
// the peer closed its end in an orderly way (its goodbye) with calls to it
// still waiting.
absl::Status peer_shut_down(absl::string_view self_name,
                            absl::string_view peer_name, int rank);

// `code` (UNAVAILABLE unless the transport knows better), "lost the
// connection between worker 's' and worker 'p' (rank r): <why>": the
// connection the calls were on broke.
absl::Status connection_lost(
    absl::string_view self_name, absl::string_view peer_name, int rank,
    absl::string_view why,
    absl::StatusCode code = absl::StatusCode::kUnavailable);

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_REFUSALS_H_
