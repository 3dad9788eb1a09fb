// wait_for_keys: waits until keys are set in a c10d store, woken by each
// key's arrival rather than by a poll interval.
//
// One blocking wait() per key still missing, in order, each bounded by what
// is left of the deadline: the store answers a WAIT the moment its key is
// set (TCPStore's server, HashStore's condition variable), so a waiter
// leaves as soon as the last key arrives, after one request per key it had
// to wait for. Single keys only: a TCPStore wait across several keys proved
// to miss its wake-up under load.
//
// A poll with check() at growing intervals (up to 50 ms) made a worker that
// arrived first notice the last one up to 50 ms late, twice per start (the
// rendezvous and the backend's address exchange), and sent a request per
// interval while it waited.
#ifndef TETHER_CORE_TOOLKIT_STORE_WAIT_H_
#define TETHER_CORE_TOOLKIT_STORE_WAIT_H_

#include <absl/time/time.h>

#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace tether::internal {

// True once every key of `keys` is set; false when `deadline` passed first.
// Rethrows what the store throws for any other reason (a lost store). After
// a timed-out wait, LibTorch's TCPStore client may read the server's late
// answer as that of its next request: a caller treats false as the end of
// its use of the store, as a failed join is.
[[nodiscard]] bool wait_for_keys(c10d::Store& store,
                                 const std::vector<std::string>& keys,
                                 absl::Time deadline);

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_STORE_WAIT_H_
