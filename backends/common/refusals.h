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

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_REFUSALS_H_
