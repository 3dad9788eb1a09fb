// A stranger's plain sockets: what the hostile-peer tests connect to a
// worker's ports with, send bytes on and watch for the worker's end of the
// connection. Every wait is bounded by the caller's `bound`.
//
// The addresses come from testing/process_resources.h (the sockets a
// process listens on, as the kernel reports them).
#ifndef TETHER_TESTING_RAW_SOCKETS_H_
#define TETHER_TESTING_RAW_SOCKETS_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>

#include <cstddef>
#include <string>
#include <vector>

#include "testing/process_resources.h"

namespace tether::testing {

// A connected, non-blocking stream socket to `target` (TCP or unix), or -1
// (errno set) if it cannot connect within `bound`.
int connect_to(const ListeningAddress& target, absl::Duration bound);

// Sends all of `bytes` on `fd` within `bound`; false if the peer closed
// the connection first (or the bound passed).
bool send_all(int fd, absl::string_view bytes, absl::Duration bound);

// What arrives on `fd` within `bound`: 1 to `at_most` bytes, or an error
// (UNAVAILABLE once the peer has ended the connection, DEADLINE_EXCEEDED).
absl::StatusOr<std::string> receive_some(int fd, absl::Duration bound,
                                         size_t at_most = 4096);

// Closes `fd` with a reset (SO_LINGER 0), as a crashed client's kernel
// would.
void reset(int fd);

// Reads and drops what the peer sends on each of `fds` until it ends the
// connection (end of stream or reset) or `bound` passes: which ended.
std::vector<bool> ended_within(const std::vector<int>& fds,
                               absl::Duration bound);

// Sends `bytes` on a fresh connection to `target` and waits up to `bound`
// for the peer to end it; closes it. True if the peer did (a failure to
// connect is a test failure).
bool send_and_expect_close(const ListeningAddress& target,
                           absl::string_view bytes, absl::Duration bound);

}  // namespace tether::testing

#endif  // TETHER_TESTING_RAW_SOCKETS_H_
