// PendingRequests: the book an agent keeps of the requests it has sent and
// awaits responses to.
//
// Every backend (loopback, tensorpipe, grpc, libfabric) needs
// the same bookkeeping behind Agent::send(): an id for the request, a Promise
// of its response, a timer that fails it with DEADLINE_EXCEEDED, completion
// when the response arrives (a late one is dropped), UNAVAILABLE for the
// requests that left on a connection that broke, and CANCELLED for all of
// them at shutdown. The agent owns one PendingRequests and a TimerQueue; it
// moves the bytes, this class keeps the promises. The error texts are the
// agent's: it passes them in.
//
// Ownership: the TimerQueue is borrowed. The agent keeps it alive until
// cancel_all() has returned (or this object is gone); after that it is never
// used again. Timers hold this object's table weakly: one that fires after
// this object is gone finds nothing.
//
// Thread safety: every method may be called from any thread, concurrently,
// including from the callbacks of the futures it hands out.
//
// Callbacks and threads: a response future completes on the thread of the
// call that completes it (complete(), fail_connection(), cancel_all(), the
// destructor), or on the timer thread when its timeout fires; never while
// this object holds its lock, and never inside add().
#ifndef TETHER_CORE_TOOLKIT_PENDING_REQUESTS_H_
#define TETHER_CORE_TOOLKIT_PENDING_REQUESTS_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/future.h"
#include "core/toolkit/timer.h"
#include "core/message.h"

namespace tether::internal {

class PendingRequests {
 public:
  // A request's id, as the agent puts it in Message::id.
  using Id = int64_t;
  // A name the agent picks for the link a request left on (a pipe, a
  // stream, an endpoint), so that it can fail them together when the link
  // breaks. Any value but kNoConnection.
  using Connection = uint64_t;
  static constexpr Connection kNoConnection = 0;

  struct Request {
    Id id = 0;
    Future<Message> response;
  };

  explicit PendingRequests(TimerQueue* timers);
  // Fails what is still pending with CANCELLED (in words of its own: call
  // cancel_all() first).
  ~PendingRequests();
  PendingRequests(const PendingRequests&) = delete;
  PendingRequests& operator=(const PendingRequests&) = delete;

  // Registers a request: a fresh id (ids start at 1) and the future of its
  // response. Unless `timeout` is infinite, the request fails with
  // DEADLINE_EXCEEDED "<TYPE> request to worker '<peer>' timed out after
  // <timeout>" when it is still pending then (the text is made only then).
  // After cancel_all(), returns cancel_all()'s status.
  [[nodiscard]] absl::StatusOr<Request> add(absl::Duration timeout,
                                            MessageType type,
                                            absl::string_view peer);

  // Records that request `id` left on `connection`. False if the request is
  // no longer pending (it timed out, failed or was cancelled meanwhile).
  // An agent sends a request that timed out before it left all the same: a
  // timeout ends the caller's wait, not the delivery (as in
  // torch.distributed.rpc), so whether a timed-out request ran never
  // depends on how long its connection took to open. Its response, if any,
  // is dropped (complete()).
  bool set_connection(Id id, Connection connection);

  bool contains(Id id) const;

  // Completes request `id` with `result` (its response or an error) and
  // cancels its timer. Returns false, and drops `result`, if the request is
  // no longer pending: a response racing its timeout is harmless.
  bool complete(Id id, absl::StatusOr<Message> result);

  // Fails with `status` every pending request that left on `connection`.
  void fail_connection(Connection connection, const absl::Status& status);

  // Fails with `status` every pending request to worker `peer`.
  void fail_peer(absl::string_view peer, const absl::Status& status);

  // For each worker that requests other than PINGs are pending to, when the
  // oldest of them was added: whom a liveness watch should probe.
  std::vector<std::pair<std::string, absl::Time>> waiting_since() const;

  // For shutdown: fails every pending request with `status`, and later
  // add() calls with it too. Only the first call counts.
  void cancel_all(const absl::Status& status);

  // How many requests are pending.
  size_t size() const;

  // Blocks until no request is pending, or until `deadline`; true if none.
  bool wait_until_empty(absl::Time deadline) const;

  // The same, leaving PINGs out: what a graceful drain waits for. A PING
  // makes no work for its peer, and one to a peer found lost may wait the
  // whole peer timeout.
  size_t calls() const;
  bool wait_until_no_calls(absl::Time deadline) const;

 private:
  struct Entry {
    Promise<Message> promise;
    TimerQueue::Id timer = 0;
    Connection connection = kNoConnection;
    std::string peer;
    absl::Time added;
    bool ping = false;
  };

  // Shared with the timers, which hold it weakly.
  struct Table {
    explicit Table(TimerQueue* timers) : timers(timers) {}

    // Removes `id` and cancels its timer; nullopt if it was not pending.
    std::optional<Promise<Message>> take(Id id)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

    TimerQueue* const timers;
    mutable absl::Mutex mu;
    // Set by cancel_all(): the queue may be gone, add() refuses.
    std::optional<absl::Status> closed ABSL_GUARDED_BY(mu);
    Id next_id ABSL_GUARDED_BY(mu) = 1;
    absl::flat_hash_map<Id, Entry> entries ABSL_GUARDED_BY(mu);
    // How many of `entries` are PINGs.
    size_t pings ABSL_GUARDED_BY(mu) = 0;
  };

  // Fails with `status` every pending request `pick(entry)` is true for.
  template <typename Pick>
  void fail_where(const Pick& pick, const absl::Status& status);

  // Completes `id` with `result` if it is still pending in `table`.
  static bool finish(Table& table, Id id, absl::StatusOr<Message> result);
  // Fails `id`, if it is still pending in `table`, with DEADLINE_EXCEEDED
  // naming its type, its peer and `timeout`.
  static void time_out(Table& table, Id id, MessageType type,
                       absl::Duration timeout);

  const std::shared_ptr<Table> table_;
};

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_PENDING_REQUESTS_H_
