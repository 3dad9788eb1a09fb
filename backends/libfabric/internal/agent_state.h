// The AgentState of a libfabric agent (internal to the libfabric backend): what
// one agent has beyond the agent skeleton it is built on, shared by the
// public Agent (common::SharedStateAgent) and the callbacks of its futures,
// and used by its progress thread until shutdown() has joined it.
// libfabric_agent.h describes the agent; its methods are defined by seam:
//   creation.cc        opening the fabric, wake-ups, exchanging records
//   membership.cc      peers' records, adding and removing peers
//   api.cc             the skeleton's hooks and the any-thread helpers
//   progress.cc        the progress loop, completions, teardown
//   eager.cc           eager frames and their credits
//   peer_auth.cc       the authentication handshake
//   messages.cc        sending, receiving and handling messages
//   rendezvous.cc      pulling and sending large buffers
//   liveness.cc        lost peers, keepalives, housekeeping
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_AGENT_STATE_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_AGENT_STATE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <rdma/fabric.h>
#include <rdma/fi_eq.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/common/agent_skeleton.h"
#include "backends/common/fd_assist.h"
#include "backends/common/peer_table.h"
#include "backends/common/refusals.h"
#include "backends/libfabric/internal/fabric.h"
#include "backends/libfabric/internal/framing.h"
#include "backends/libfabric/internal/listener_guard.h"
#include "backends/libfabric/internal/mr_cache.h"
#include "backends/libfabric/internal/operations.h"
#include "backends/libfabric/internal/peer.h"
#include "backends/libfabric/internal/record.h"
#include "backends/libfabric/internal/settings.h"
#include "backends/libfabric/libfabric_agent.h"
#include "core/agent.h"
#include "core/auth/auth.h"
#include "core/toolkit/pending_requests.h"
#include "core/toolkit/timer.h"

namespace tether::backends::libfabric::internal {

inline constexpr common::BackendNames kLibfabricNames{
    "libfabric",         "libfabric",
    "tether/libfabric/", "libfabric.address",
    "libfabric.peer_timeout_ms", kPeerTimeout};
constexpr size_t kSendBuffers = 64;

// Which agent's progress thread this is (nullptr: none).
extern thread_local const void* t_progress_of;

using tether::internal::PendingRequests;
using tether::internal::TimerQueue;

// The wire format's names (internal/framing.h) read framing::kHeaderSize, as
// they did before the split out of libfabric_agent.cc.
namespace framing = libfabric::internal;

// Everything an agent has, over the agent skeleton
// (backends/common/agent_skeleton.h), which owns the setup, the peer table
// (rank by name, each peer's published record), the pending and incoming
// requests, the closed flag and the shutdown order. A response's route is
// the requester's rank. Callbacks of futures hold it weakly; its progress
// thread uses it until shutdown() has joined that thread.
//
// Thread safety: the creating thread runs init() before the progress thread
// exists; from then on only the thread that holds the drive token
// (drive_mu_) calls libfabric and touches the members under "the progress
// thread's own". The progress thread holds it except while it sleeps; a
// thread waiting for its answer on a provider with a wait descriptor
// (tcp;ofi_rxm) takes it to drive the completion queue itself (the assist,
// backends/common/fd_assist.h), and marks itself as the progress thread
// while it does (t_progress_of). Other threads hand the progress thread work
// with post() and wake() (commands_, under the skeleton's mu_); the members
// set by the constructor and by init() before the thread starts are const.
class AgentState : public common::AgentSkeleton<AgentState, int>,
              public common::AssistSource {
 public:
  AgentState(AgentSetup setup, Settings settings)
      : AgentSkeleton(setup, kLibfabricNames),
        settings_(as_wished(std::move(settings), setup.address_defaulted)) {}

  ~AgentState() {
    // WARNING: this may run on any thread that held the last reference;
    // shutdown() has joined the progress thread and closed the fabric.
    if (event_fd_ >= 0) ::close(event_fd_);
    if (doorbell_fd_ >= 0) ::close(doorbell_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  // ---- the Agent's calls the skeleton does not make, from any thread
  // (creation.cc: init; api.cc: stats)
  absl::Status init();
  absl::StatusOr<LibfabricStats> stats();
  // Agent::endpoint_of, hiding the skeleton's: the socket address in the
  // record `worker` published (tcp;ofi_rxm), nullopt for shm.
  absl::StatusOr<std::optional<Endpoint>> endpoint_of(
      const WorkerInfo& worker) const;

  // The assist (progress.cc), from a thread that waits for an answer: it
  // takes the completion queue's descriptor from the progress thread's
  // watch and drives the queue itself, with the drive token.
  int begin_assist() override ABSL_LOCKS_EXCLUDED(drive_mu_, assist_mu_);
  bool assist_step() override ABSL_LOCKS_EXCLUDED(drive_mu_);
  void end_assist() override ABSL_LOCKS_EXCLUDED(drive_mu_, assist_mu_);

 private:
  friend class AgentSkeleton<AgentState, int>;

  // What shutdown() takes out of the state, closes and joins, outside the
  // lock: the commands may hold user objects.
  struct Resources {
    std::thread progress;
    std::deque<std::function<void()>> commands;
  };

  // ---- the skeleton's hooks (api.cc; membership.cc: the peer hooks)
  bool on_own_thread() const { return t_progress_of == this; }
  void take_resources(Resources& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the progress thread, which sees closed_, says goodbye and closes
  // the fabric.
  void close_resources(Resources& resources);
  void join_resources(Resources& resources);
  Future<Message> start_send(const common::Peer& peer, Message request,
                             PendingRequests::Request pending);
  void send_response(int rank, int64_t id,
                     const absl::StatusOr<Message>& result);
  void run_deferred_later(Incoming::Deferred deferred);
  // The table holds each peer's record as published; install_peer() checks
  // it (peer_record()) against the worker it is for.
  static absl::StatusOr<std::string> address_of(const std::string& published) {
    return published;
  }
  // Dynamic groups: the progress thread checks the joiner's record and
  // inserts it (install_peer()).
  absl::Status on_peer_added(const common::Peer& peer);
  // Dynamic groups: the progress thread marks it leaving; it is dropped on
  // its goodbye or when a worker joins with its rank.
  void on_peer_removed(const WorkerInfo& worker);

  // ---- any thread (api.cc)
  // From a thread other than the progress thread, with the drive token if
  // it is free (progress.cc): sends `request` (moved from only then) at
  // once when it is a small request to a ready peer with nothing queued
  // before it, saving the progress thread's wake-up; false otherwise.
  bool send_directly(int rank, int64_t id, Message& request)
      ABSL_LOCKS_EXCLUDED(drive_mu_, mu_);
  // Runs `command` on the progress thread; false once shut down.
  bool post(std::function<void()> command) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `command` on the progress thread and waits until it has run:
  // CANCELLED once shut down, DEADLINE_EXCEEDED ("... did not <doing>
  // within 10s") if the thread does not get to it. On the progress thread
  // (or a thread assisting it) it runs `command` at once.
  absl::Status call_on_progress_thread(std::function<void()> command,
                                       absl::string_view doing)
      ABSL_LOCKS_EXCLUDED(mu_);
  void wake();
  bool has_commands() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- creation: the creating thread, before the progress thread runs
  // (creation.cc)
  absl::Status open_fabric();
  absl::Status exchange_records();
  absl::Status set_up_wakeups();
  // The eager receive pool holds buffers for `peers` workers (grows only).
  // Also on the progress thread, from install_peer().
  absl::Status grow_pool(size_t peers);

  // ---- membership: the progress thread, or init() before it runs
  // (membership.cc)
  // Checks a peer's record against ours (provider) and, unless `worker`
  // has no name (yet), its name.
  absl::StatusOr<Record> peer_record(const WorkerInfo& worker,
                                     absl::string_view published) const;
  // Makes `worker` a known peer with `record` (a fresh slot: its address
  // inserted, credits and buffers for it). On the progress thread, or in
  // init() before it runs.
  absl::Status install_peer(const WorkerInfo& worker, const Record& record);
  // Dynamic groups, the progress thread: a frame from rank `rank`, unknown
  // here, is the first word of a joiner the Worker has not been told of
  // yet: its record names it. False if there is none.
  bool adopt_unknown(int rank);
  // Dynamic groups: forgets a peer that left (fails what waits on it with
  // `why`, takes its address out of the address vector).
  void drop_peer(int rank, const absl::Status& why);

  // ---- the progress loop and libfabric operations: the progress thread
  // (progress.cc)
  void run();
  bool run_commands(bool* stop) ABSL_LOCKS_EXCLUDED(mu_);
  // One round of the loop's work, with the drive token: kWorked if there
  // was some, kIdle once nothing is left and the completion queue's
  // descriptor is armed (fi_trywait), kStopped once shut down.
  enum class Drove { kWorked, kIdle, kStopped };
  Drove drive_once();

  // Sleeps until woken or until a timeout; true if the timeout ran out.
  bool idle(absl::Time next_tick, absl::Duration* poll_sleep,
            absl::Duration* nap);
  // Something of ours waits on a peer or on the provider.
  bool waiting();
  bool poll_completions();
  void on_completion(Op* op, size_t length);
  void on_error(const fi_cq_err_entry& error);
  // Says goodbye, closes (or parks, shm) the endpoint; also init()'s
  // clean-up when creation fails.
  void teardown();
  int issue(Op* op);
  void post_receive(Op* op);
  bool pump();
  bool have_tx_room() const { return tx_inflight_ < tx_limit_; }

  // ---- eager frames and their credits: the progress thread (eager.cc)
  void enqueue(int rank, OutFrame frame);
  void send_control(int rank, FrameKind kind, uint64_t arg0 = 0,
                    uint64_t arg1 = 0, uint64_t arg2 = 0);
  enum class Sent { kSent, kWait, kFailed };
  Sent transmit(Peer& peer, OutFrame& frame, bool control);
  bool flush(Peer& peer);
  bool send_due_credits();
  void on_frame(Op* op, size_t length);

  // ---- authentication: the progress thread (peer_auth.cc)
  void send_auth(int rank, AuthFrame frame);
  // As the client: a new handshake with the peer, our Hello sent.
  void start_client_auth(Peer& peer);
  // Sends a handshake's `messages` in auth frames of our `role`.
  void send_handshake(Peer& peer, auth::Role role,
                      const std::vector<auth::HandshakeMessage>& messages);
  void on_auth_frame(Peer& peer, absl::string_view tail);
  // Whether a frame of `kind` from `peer` may be acted on; if not, it is
  // dropped with a log line (and a request is refused).
  bool admitted(Peer& peer, const FrameHeader& header);
  // As the server: tells the peer why, forgets its handshake.
  void refuse(Peer& peer, const std::string& why);
  // As the client: fails our requests to the peer with `status`
  // (UNAUTHENTICATED); the next request starts a new handshake.
  void fail_client_auth(Peer& peer, const absl::Status& status);

  // ---- messages: sending, receiving, the request handler; the progress
  // thread (messages.cc)
  void start_request(int rank, int64_t id, Message request);
  void respond(int rank, int64_t id, const absl::StatusOr<Message>& result);
  void send_message(int rank, FrameKind kind, int64_t id, int32_t code,
                    Message message);
  void on_message_frame(Peer& peer, const FrameHeader& header,
                        absl::string_view rest);
  absl::Status set_up_segments(Arrival& in, absl::string_view body);
  void finish_incoming(const std::shared_ptr<Arrival>& in);
  void deliver(Arrival& in);

  // ---- large buffers by rendezvous: the progress thread (rendezvous.cc)
  void pump_pull(const std::shared_ptr<Arrival>& in);
  void on_pulled(Op* op, const absl::Status& status);
  void on_clear_to_send(Peer& peer, uint64_t transfer, uint64_t first,
                        uint64_t count);
  bool pump_sends();

  // ---- liveness: the progress thread (liveness.cc)
  void heard_from(Peer& peer);
  void fail_peer(int rank, const absl::Status& status);
  void housekeeping(absl::Time now);

  // ---- about peers: the progress thread
  PendingRequests::Connection connection_of(const Peer& peer) const {
    return (static_cast<uint64_t>(peer.epoch) << 32) |
           static_cast<uint64_t>(peer.rank + 1);
  }
  // The name of the worker at `rank`, "" if it has none (yet).
  std::string name_at(int rank) const {
    return installed(rank) ? ranks_[rank].name : std::string();
  }
  std::string describe(int rank) const {
    return common::describe_peer(name_at(rank), rank);
  }
  static bool absent(const Peer& peer) { return peer.rank < 0 || peer.left; }
  // Whether install_peer() has given `rank` a slot (it may have left since).
  bool installed(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < ranks_.size();
  }
  uint32_t in_flight(const Peer& peer) const {
    return peer.granted - peer.credits + (peer.control_slot_free ? 0 : 1);
  }

  // ======== members

  // ---- set by the constructor: any thread
  // The address every backend listens on by default (`defaulted`) is a
  // wish: a provider that cannot bind to it may still pick its own.
  static Settings as_wished(Settings settings, bool defaulted) {
    if (defaulted) settings.address_given = false;
    return settings;
  }

  const Settings settings_;

  // ---- what other threads hand the progress thread: any thread, under
  // mu_ (the skeleton's)
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  std::thread progress_ ABSL_GUARDED_BY(mu_);

  // ---- wake-ups of the progress thread: set by init(), then read by any
  // thread
  int event_fd_ = -1;
  int epoll_fd_ = -1;
  // The completion queue's wait descriptor (-1: a polled provider).
  int cq_fd_ = -1;
  // Polled providers: a Unix datagram socket that same-host peers write a
  // byte to after each frame they send us, so that an idle progress thread
  // can sleep instead of polling (its name is published in our record).
  int doorbell_fd_ = -1;
  std::string doorbell_name_;
  std::atomic<bool> sleeping_{false};

  // ---- the drive token: held by the progress thread except while it
  // sleeps, or by a thread assisting (progress.cc)
  absl::Mutex drive_mu_;
  // Threads assisting: while any, the progress thread does not watch the
  // completion queue's descriptor.
  absl::Mutex assist_mu_;
  int assistants_ ABSL_GUARDED_BY(assist_mu_) = 0;
  // The progress thread has closed the fabric: nothing may drive it.
  bool torn_down_ ABSL_GUARDED_BY(drive_mu_) = false;
  // The progress thread runs (set once it holds the token).
  bool driving_ ABSL_GUARDED_BY(drive_mu_) = false;
  // A caller's thread sends with the token (send_directly()): what would
  // complete futures goes to the progress thread instead.
  bool sending_directly_ ABSL_GUARDED_BY(drive_mu_) = false;

  // ---- the progress thread's own (and init()'s, before it starts)
  // WARNING: declared first, destroyed last: what follows may hold its
  // registrations (teardown() normally empties it all before).
  std::unique_ptr<Fabric> fabric_;
  // The fabric's limits and what init() chose with them.
  RendezvousMode mode_ = RendezvousMode::kRead;  // how we pull
  uint64_t threshold_ = 0;                       // the rendezvous threshold
  uint64_t buffer_size_ = 0;                     // our eager buffers
  uint32_t credits_ = 0;                         // we grant each peer
  uint64_t send_buffer_size_ = 0;
  uint64_t chunk_size_ = 0;
  size_t tx_limit_ = 0;
  size_t rx_limit_ = 0;
  size_t rx_reserve_ = 0;
  // Set at init.
  std::string host_;

  // The progress loop (progress.cc).
  absl::Duration spin_;
  absl::Duration tick_;
  size_t tx_inflight_ = 0;
  size_t rx_inflight_ = 0;
  // Operations we allocated that libfabric holds.
  absl::flat_hash_set<Op*> inflight_;
  // Eager buffers refused with FI_EAGAIN, to post again in order.
  std::deque<Op*> retry_;
  // Something was refused with FI_EAGAIN since the last sleep.
  bool refused_ = false;
  // Every peer has a doorbell we can ring, so none needs us to poll
  // (install_peer() clears it).
  bool all_peers_ring_ = true;

  // Eager buffers (creation.cc). The eager receive buffers: one slab per
  // growth of the pool (a dynamic group's pool grows as workers join; it
  // never shrinks: a leaver's buffers wait for the next joiner).
  std::vector<std::vector<char>> receive_slabs_;
  std::vector<char> send_slab_;
  std::vector<std::unique_ptr<MemoryRegion>> receive_regions_;
  // How many peers (self included) the pool holds buffers for, and how
  // many are known now.
  size_t pool_peers_ = 0;
  size_t known_peers_ = 0;
  std::unique_ptr<MemoryRegion> send_region_;
  std::vector<std::unique_ptr<Op>> receive_ops_;
  std::vector<std::unique_ptr<Op>> send_ops_;
  std::vector<size_t> free_send_buffers_;

  // Peers by rank, with their eager frames (membership.cc, eager.cc).
  std::vector<Peer> ranks_;
  std::vector<int> queued_ranks_;
  std::vector<int> credit_due_;

  // Messages and rendezvous (messages.cc, rendezvous.cc).
  // WARNING: declared before the transfers, whose handles it must outlive.
  std::unique_ptr<MrCache> mr_cache_;
  std::deque<std::shared_ptr<Arrival>> pulls_waiting_;
  std::deque<SendRange> sends_waiting_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> transfers_;
  uint64_t next_transfer_ = 1;
  uint64_t next_sequence_ = 0;

  // Liveness and housekeeping (liveness.cc).
  absl::Duration keepalive_interval_;
  absl::Time last_prune_ = absl::InfinitePast();
  absl::Time last_housekeeping_ = absl::InfinitePast();
  // Strangers on the provider's TCP listener (tcp providers only).
  std::unique_ptr<ListenerGuard> listener_guard_;
  absl::Time last_guard_sweep_ = absl::InfinitePast();

  LibfabricStats stats_;
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_AGENT_STATE_H_
