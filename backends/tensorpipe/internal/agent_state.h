// The tensorpipe agent's state, shared by its files: agent_state.cc
// (creation, the skeleton's shutdown hooks), agent_client.cc (requests out,
// responses in) and agent_server.cc (requests in, responses out). The
// Agent itself is backends/common's skeleton over this state
// (backends/common/agent_skeleton.h); tensorpipe_agent.cc builds it.
//
// Ownership: held by a shared_ptr; tensorpipe callbacks hold it weakly.
//
// Thread safety: as the Agent's (core/agent.h); members say which lock
// guards them (mu_, the skeleton's).
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_AGENT_STATE_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_AGENT_STATE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/functional/function_ref.h>
#include <absl/random/random.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <tensorpipe/tensorpipe.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/common/agent_skeleton.h"
#include "backends/common/agent_support.h"
#include "backends/common/peer_table.h"
#include "backends/tensorpipe/internal/framing.h"
#include "backends/tensorpipe/internal/settings.h"
#include "backends/tensorpipe/internal/tcp_transport.h"
#include "core/agent.h"
#include "core/auth/handshake.h"
#include "core/toolkit/serial_executor.h"
#include "core/toolkit/timer.h"

namespace tether::backends::tensorpipe::internal {

using common::ScopedMark;
using tether::internal::SerialExecutor;
using tether::internal::TimerQueue;

inline constexpr common::BackendNames kTensorPipeNames{
    "tensorpipe", "tensorpipe", "tether/tensorpipe/", "tensorpipe.address"};

// Which agent's tensorpipe callback or io task this thread is running
// (nullptr: none). They decide whether a call may go straight to tensorpipe
// and what shutdown() can wait for. (Request handlers are marked by
// common::IncomingRequests, timer callbacks by TimerQueue::running_owner().)
extern thread_local const void* t_tp_callback_of;
extern thread_local const void* t_io_task_of;
// Which agent's direct write (AgentState::write_directly) this thread is
// inside.
extern thread_local const void* t_direct_write_of;

// tensorpipe aborts the process when a listener cannot bind (it throws on
// its event loop thread), so the agent checks first that `url` can listen:
// "uv://ip[:port]" or "tcp://ip[:port]" (IPv6 in brackets) or "shm://name"
// (an abstract socket; an empty name is always free).
[[nodiscard]] absl::Status check_can_listen(const std::string& url);

// Everything an agent's callbacks touch. Callbacks hold it weakly: a
// callback that fires after the agent is gone finds nothing and returns.
// Where a response goes: the pipe the request came on, and for a request
// that came as an express frame (tcp_transport.h) its connection too.
struct ReplyRoute {
  std::weak_ptr<::tensorpipe::Pipe> pipe;
  std::weak_ptr<tcp::ConnectionImpl> express;
};

class AgentState
    : public common::AgentSkeleton<AgentState, ReplyRoute> {
 public:
  AgentState(AgentSetup setup, Settings settings)
      : AgentSkeleton(setup, kTensorPipeNames),
        settings_(std::move(settings)),
        io_(std::make_unique<SerialExecutor>()) {}

  ~AgentState() {
    // WARNING: this may run on a tensorpipe thread (a callback held the last
    // reference); shutdown() has already taken every tensorpipe object and
    // thread out of here, so nothing below joins a thread.
  }

  absl::Status init();
  void remove_peer(const WorkerInfo& worker);
  // Agent::link_to: the transport and CPU channel TensorPipe's negotiation
  // picks for this worker and `worker` (its rule: the highest priority
  // both offer with equal descriptors), from what each published.
  absl::StatusOr<PeerLink> link_to(const WorkerInfo& worker) const;

 private:
  friend class AgentSkeleton<AgentState, ReplyRoute>;

  // The pipe this worker's requests to a peer go on: one it opened, or one
  // the peer opened (`adopted`: a pipe carries both ways, so that a pair of
  // workers holds one pipe, not one per direction; docs/benchmarks.md,
  // "Scale").
  struct ClientPipe {
    ClientPipe(int rank, std::shared_ptr<::tensorpipe::Pipe> pipe,
               PendingRequests::Connection connection,
               std::unique_ptr<auth::Handshake> handshake, bool adopted = false)
        : rank(rank),
          pipe(std::move(pipe)),
          connection(connection),
          adopted(adopted),
          handshake(std::move(handshake)),
          ready(this->handshake == nullptr) {}
    const int rank;
    const std::shared_ptr<::tensorpipe::Pipe> pipe;
    // What the requests written (or being written) on this pipe are bound
    // to in pending_.
    const PendingRequests::Connection connection;
    // Opened by the peer: its read loop is the server side's (read_requests),
    // which hands the responses here.
    const bool adopted;
    // Requests bound to this pipe and not answered yet (under mu_).
    int64_t outstanding = 0;
    // Replaced by the pipe the peer opened (both opened one at once): closed
    // once `outstanding` is 0 (under mu_).
    bool retiring = false;
    // The peer sends its requests here too (under mu_): never retired.
    bool serves_peer = false;
    // A frame came from the peer on this pipe: it is connected (under mu_).
    bool heard = false;
    // Authentication (the machine is used under AgentState::mu_; null
    // without a secret): requests wait in `queued` until this side has
    // answered the server's challenge (`ready`); responses are accepted once
    // the server has answered ours (server_verified()).
    const std::unique_ptr<auth::Handshake> handshake;
    bool ready;
    bool server_verified() const {
      return handshake == nullptr || handshake->verified();
    }
    std::vector<std::pair<int64_t, std::shared_ptr<OutgoingFrame>>> queued;
    // The pipe's own tcp connection (null on another transport, and for an
    // adopted pipe), and the nonce it was bound with (under mu_). Once the
    // server has bound it (`express_ready`), inline frames go on it as
    // express frames (framing.h).
    std::shared_ptr<tcp::ConnectionImpl> express;
    uint64_t bind_nonce = 0;
    std::atomic<bool> express_ready{false};
  };

  // Server side: an express kBind seen on a connection, waiting for the
  // pipe's; and a connection bound to its pipe.
  // kBinds waiting for their pipe's at most (a peer sends one per pipe it
  // opens, and the pipe's follows at once).
  static constexpr size_t kMaxExpressBinds = 1024;
  struct ExpressBind {
    std::weak_ptr<tcp::ConnectionImpl> connection;
    std::string peer;
  };
  struct ExpressLink {
    std::weak_ptr<tcp::ConnectionImpl> connection;
    std::weak_ptr<::tensorpipe::Pipe> pipe;
  };

  // What shutdown() takes out of the state, closes and joins, outside the
  // lock (the skeleton's hooks below).
  struct Resources {
    std::shared_ptr<::tensorpipe::Context> context;
    std::shared_ptr<::tensorpipe::Listener> listener;
    std::vector<std::shared_ptr<::tensorpipe::Pipe>> pipes;
    std::unique_ptr<SerialExecutor> io;
  };

  // The skeleton's hooks (backends/common/agent_skeleton.h).
  bool on_own_thread() const {
    return t_tp_callback_of == this || t_io_task_of == this;
  }
  void take_resources(Resources& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // From here on every pending tensorpipe operation fails; our callbacks
  // see closed_ and do nothing.
  static void close_resources(Resources& resources);
  // Joins, in this order: our io thread (its last tasks may still call
  // tensorpipe), then tensorpipe's threads (the skeleton joins the timer
  // thread after).
  static void join_resources(Resources& resources);
  Future<Message> start_send(const common::Peer& peer, Message request,
                             PendingRequests::Request pending);
  void run_deferred_later(Incoming::Deferred deferred);
  absl::StatusOr<std::string> address_of(const std::string& published) {
    return url_to(published);
  }

  // Holds the state for a tensorpipe callback and marks the thread.
  class CallbackScope {
   public:
    explicit CallbackScope(const std::weak_ptr<AgentState>& weak)
        : state_(weak.lock()), mark_(t_tp_callback_of, state_.get()) {}
    AgentState* operator->() const { return state_.get(); }
    AgentState& operator*() const { return *state_; }
    explicit operator bool() const { return state_ != nullptr; }

   private:
    const std::shared_ptr<AgentState> state_;
    const common::ScopedMark mark_;
  };

  // Runs `work(AgentState&)` for one of this agent's tensorpipe callbacks.
  // TensorPipe runs callbacks on whichever thread drives its loop, and a
  // thread that enters the loop to write (a direct write, below: a user's
  // thread in send(), the pool's with a response) drains what other threads
  // queued meanwhile. There `work` goes to the io thread instead, so that no
  // future completes inside send() or under its caller's locks.
  template <typename Work>
  static void on_callback(const std::weak_ptr<AgentState>& weak, Work work) {
    if (t_direct_write_of != nullptr) {
      std::shared_ptr<AgentState> state = weak.lock();
      if (state == nullptr) return;
      state->post_io([work = std::move(work)](AgentState& state) mutable {
        common::ScopedMark mark(t_tp_callback_of, &state);
        work(state);
      });
      return;
    }
    CallbackScope state(weak);
    if (!state) return;
    work(*state);
  }

  // True inside one of this agent's tensorpipe callbacks: tensorpipe runs
  // those on its event loop, so calls made here are queued, never run
  // inline.
  bool in_tp_callback() const { return t_tp_callback_of == this; }

  // Runs `write` (which enters tensorpipe) on this thread, counted so that
  // shutdown() waits for it before joining tensorpipe's threads; false (and
  // nothing done) once shut down. Saves the hand-off to the io thread and
  // its wake-up, most of a small call's cost on a loaded machine.
  bool write_directly(absl::FunctionRef<void()> write)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A request from a thread that is not ours goes straight to its pipe
  // when that pipe is ready and nothing queued on the io thread could be
  // overtaken (a thread's requests leave in the order it sent them, but
  // that a small one, an express frame, may pass a large one still in
  // TensorPipe's pipe); false when the io thread must write it (counted in
  // queued_io_writes_).
  bool write_request_directly(int rank, int64_t id,
                              std::shared_ptr<OutgoingFrame>& frame)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `task` on the io thread; false once shut down.
  bool post_io(std::function<void(AgentState&)> task) ABSL_LOCKS_EXCLUDED(mu_);

  // Client side.
  void write_request(int rank, int64_t id, std::shared_ptr<OutgoingFrame> frame)
      ABSL_LOCKS_EXCLUDED(mu_);
  void read_responses(std::shared_ptr<ClientPipe> client);
  void on_response_descriptor(const std::shared_ptr<ClientPipe>& client,
                              const ::tensorpipe::Error& error,
                              const ::tensorpipe::Descriptor& descriptor);
  void on_response(const std::shared_ptr<ClientPipe>& client,
                   const std::shared_ptr<IncomingFrame>& frame,
                   const ::tensorpipe::Error& error);
  void on_client_pipe_error(
      const std::shared_ptr<ClientPipe>& client, absl::string_view what,
      absl::StatusCode code = absl::StatusCode::kUnavailable)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A tensorpipe error: UNAUTHENTICATED if the tcp transport's handshake
  // refused the connection, else UNAVAILABLE.
  void on_client_pipe_error(const std::shared_ptr<ClientPipe>& client,
                            const ::tensorpipe::Error& error)
      ABSL_LOCKS_EXCLUDED(mu_);
  void write_on_client(const std::shared_ptr<ClientPipe>& client,
                       std::shared_ptr<OutgoingFrame> frame);
  // The pipe of `client` is ready for requests: binds its connection for
  // express frames, if it has one of ours.
  void start_express(const std::shared_ptr<ClientPipe>& client)
      ABSL_LOCKS_EXCLUDED(mu_);
  void on_bind_ack(const std::shared_ptr<ClientPipe>& client,
                   const IncomingFrame& frame) ABSL_LOCKS_EXCLUDED(mu_);
  // An express frame (the transport's sink, in its loop): a kBind, a
  // request on a bound connection, or a response on one of ours; anything
  // else fails the connection.
  void on_express(const std::shared_ptr<tcp::ConnectionImpl>& connection,
                  absl::string_view bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // A response (or error) to one of our requests, from either read loop.
  void deliver_response(const std::shared_ptr<ClientPipe>& client,
                        IncomingFrame& frame) ABSL_LOCKS_EXCLUDED(mu_);
  // A client pipe on `pipe`, accepted from worker `rank`; in client_pipes_
  // and adopted_.
  std::shared_ptr<ClientPipe> adopt_locked(
      int rank, const std::shared_ptr<::tensorpipe::Pipe>& pipe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An accepted pipe is open (a frame has come on it), authenticated (or
  // needs not be) and comes from the worker named `name`: our requests to
  // it may go there. When both
  // workers opened a pipe at once, the one the lower rank opened carries
  // both ways and the higher rank retires its own.
  void on_pipe_from(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                    const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // If our ready client pipe to `rank` (a lower rank) and an accepted pipe
  // from it both exist, the accepted one takes over: ours is marked
  // retiring and returned when it can be closed now (nullptr otherwise).
  std::shared_ptr<ClientPipe> retire_for_accepted_locked(int rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void on_client_auth(const std::shared_ptr<ClientPipe>& client,
                      const internal::AuthFrame& auth) ABSL_LOCKS_EXCLUDED(mu_);
  // A handshake message in this backend's envelope, and back.
  static std::shared_ptr<OutgoingFrame> auth_frame(
      const auth::HandshakeMessage& message);
  static auth::HandshakeMessage handshake_message(
      const internal::AuthFrame& frame);

  // Server side.
  void accept_next(std::shared_ptr<::tensorpipe::Listener> listener);
  void on_accept(const std::shared_ptr<::tensorpipe::Listener>& listener,
                 const ::tensorpipe::Error& error,
                 std::shared_ptr<::tensorpipe::Pipe> pipe)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces a failed listener by one on the same (published) addresses;
  // retries while the old one still holds them.
  void listen_again(int attempt) ABSL_LOCKS_EXCLUDED(mu_);
  void read_requests(std::shared_ptr<::tensorpipe::Pipe> pipe);
  void on_request_descriptor(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                             const ::tensorpipe::Error& error,
                             const ::tensorpipe::Descriptor& descriptor);
  // Drops an accepted pipe; if our requests went on it too, they fail
  // with `why`.
  void drop_server_pipe(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                        absl::string_view why = "the pipe closed")
      ABSL_LOCKS_EXCLUDED(mu_);
  // A request that arrived on `route` (either kind of pipe, or express):
  // to the handler, or refused when over this worker's limits.
  void serve_request(const ReplyRoute& route, IncomingFrame& frame);
  // Forgets the express connection bound to `pipe`, and any whose pipe is
  // gone.
  void unlink_express_locked(const std::shared_ptr<::tensorpipe::Pipe>& pipe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pipe's kBind: links the connection that sent the same nonce.
  void on_bind(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
               const IncomingFrame& frame) ABSL_LOCKS_EXCLUDED(mu_);
  // Handles a frame of a server pipe still authenticating; false if it
  // was refused (and dropped).
  bool on_server_auth(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
                      IncomingFrame& frame) ABSL_LOCKS_EXCLUDED(mu_);
  // Tells the peer why, logs it, and drops the pipe.
  void refuse(const std::shared_ptr<::tensorpipe::Pipe>& pipe,
              absl::string_view peer, absl::string_view why)
      ABSL_LOCKS_EXCLUDED(mu_);
  void send_response(const ReplyRoute& route, int64_t id,
                     const absl::StatusOr<Message>& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  // As an express frame when the request came as one and `frame` is
  // inline and small enough, else on the pipe.
  void write_response(const ReplyRoute& route,
                      std::shared_ptr<OutgoingFrame> frame)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status register_transports_and_channels(std::vector<std::string>& urls);
  // A tether tcp transport (internal/tcp_transport.h) for this agent.
  std::shared_ptr<::tensorpipe::transport::Context> make_tcp_transport();
  // The url to reach a peer that published `theirs` (encode_addresses),
  // "" if it shares no transport with this worker.
  std::string url_to(const std::string& theirs) const;

  const Settings settings_;
  // This worker's listener addresses, by transport (set by init(), then
  // const). peers_ holds the url a pipe to each peer connects to ("" if we
  // share no transport).
  std::map<std::string, std::string> my_addresses_;
  // What this worker's transports and channels offer TensorPipe's
  // negotiation, published beside the addresses (set by init(), then
  // const).
  std::map<std::string, std::string> my_offer_;

  absl::flat_hash_map<int, std::shared_ptr<ClientPipe>> client_pipes_
      ABSL_GUARDED_BY(mu_);
  PendingRequests::Connection next_connection_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_set<std::shared_ptr<::tensorpipe::Pipe>> server_pipes_
      ABSL_GUARDED_BY(mu_);
  // Accepted pipes, authenticated, by the rank of the worker that opened
  // them (the latest one of each).
  absl::flat_hash_map<int, std::shared_ptr<::tensorpipe::Pipe>> accepted_from_
      ABSL_GUARDED_BY(mu_);
  // Pipes accepted without authentication whose first frame has not come
  // yet: they may still be opening, and until a pipe is open TensorPipe
  // reads nothing on it (its listener waits for the peer's channel
  // connections), so a peer that dies then never fails it. Our requests
  // go on such a pipe only once a frame has come (on_pipe_from); before,
  // a request put on it waited for its timeout when the peer was killed
  // while it connected. (With authentication the handshake's frames prove
  // the same.)
  absl::flat_hash_set<const ::tensorpipe::Pipe*> opening_ ABSL_GUARDED_BY(mu_);
  // Accepted pipes our requests go on too, with their client side.
  absl::flat_hash_map<const ::tensorpipe::Pipe*, std::shared_ptr<ClientPipe>>
      adopted_ ABSL_GUARDED_BY(mu_);
  // Server pipes still authenticating, with their handshakes (2 steps both
  // ways: each side says hello first and proves on the other's hello).
  absl::flat_hash_map<const ::tensorpipe::Pipe*,
                      std::unique_ptr<auth::Handshake>>
      server_auth_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<::tensorpipe::Context> context_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<::tensorpipe::Listener> listener_ ABSL_GUARDED_BY(mu_);
  // The urls listener_ listens on, with the addresses peers know (set by
  // init(), then const).
  std::vector<std::string> listening_urls_;
  std::unique_ptr<SerialExecutor> io_ ABSL_GUARDED_BY(mu_);
  // Requests posted to the io thread and not yet written (or queued on
  // their pipe); direct writes of requests wait until there are none.
  int64_t queued_io_writes_ ABSL_GUARDED_BY(mu_) = 0;
  // Threads inside write_directly().
  int direct_writes_ ABSL_GUARDED_BY(mu_) = 0;
  // Express frames (framing.h). Client: our pipes' connections, by
  // connection. Server: kBinds by nonce (bounded: kMaxExpressBinds), and
  // bound connections. Looked up by address, checked against the weak
  // pointer (an address may be reused once a connection is gone).
  absl::flat_hash_map<const tcp::ConnectionImpl*, std::weak_ptr<ClientPipe>>
      express_clients_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, ExpressBind> express_binds_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const tcp::ConnectionImpl*, ExpressLink> express_links_
      ABSL_GUARDED_BY(mu_);
  absl::BitGen nonces_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tether::backends::tensorpipe::internal

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_AGENT_STATE_H_
