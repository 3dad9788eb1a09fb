// The gRPC agent's state over the agent skeleton
// (backends/common/agent_skeleton.h): its server, channels and links, the
// completion queues of their streams and the threads that drive them.
// grpc_agent.cc builds it; internal/link.h holds the streams.
//
// Ownership: held by a shared_ptr; links and streams hold it weakly.
//
// Thread safety: as the Agent's (core/agent.h); members say which lock
// guards them (mu_, the skeleton's).
#ifndef TETHER_BACKENDS_GRPC_INTERNAL_AGENT_STATE_H_
#define TETHER_BACKENDS_GRPC_INTERNAL_AGENT_STATE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/status/status.h>
#include <absl/strings/string_view.h>
#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/server.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/common/agent_skeleton.h"
#include "backends/grpc/internal/link.h"
#include "backends/grpc/internal/settings.h"
#include "core/toolkit/serial_executor.h"

namespace tether::backends::grpc::internal {

inline constexpr common::BackendNames kGrpcNames{
    "grpc",           "gRPC",
    "tether/grpc/",   "grpc.address",
    "grpc.keepalive_timeout_ms", kKeepaliveTimeout};

// Everything an agent's callbacks touch. Callbacks hold it weakly: a
// callback that fires after the agent is gone finds nothing and returns.
class AgentState
    : public common::AgentSkeleton<AgentState, std::weak_ptr<Link>> {
 public:
  AgentState(AgentSetup setup, Settings settings)
      : AgentSkeleton(setup, kGrpcNames),
        settings_(std::move(settings)),
        tasks_(std::make_unique<tether::internal::SerialExecutor>()) {}

  ~AgentState() {
    // WARNING: this may run on a queue thread (a stream held the last
    // reference); shutdown() has already taken every gRPC object and thread
    // out of here, so nothing below joins a thread.
  }

  absl::Status init();
  void remove_peer(const WorkerInfo& worker) ABSL_LOCKS_EXCLUDED(mu_);

  // For a server stream whose call has arrived: accepts or refuses it,
  // and asks for the next call on its queue.
  void accept(ServerStream& stream) ABSL_LOCKS_EXCLUDED(mu_);
  // For links, on a queue thread: a message arrived whole on `link`.
  void on_received(const std::shared_ptr<Link>& link, Received received);
  // For links: `link`'s stream is gone, `why`. `client` (a client
  // stream) is deleted later, off the thread that completed it.
  void on_link_done(const std::shared_ptr<Link>& link, absl::string_view why,
                    absl::StatusCode code, std::unique_ptr<Stream> client)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class AgentSkeleton<AgentState, std::weak_ptr<Link>>;

  // A completion queue of the server (its client streams use it too) and
  // the thread that drives it: runs what gRPC completes for the streams on
  // it, their messages included (the request handler, send() futures).
  struct Queue {
    std::unique_ptr<::grpc::ServerCompletionQueue> queue;
    std::thread thread;
  };

  // What shutdown() takes out of the state, closes and joins, outside the
  // lock (the skeleton's hooks below).
  struct Resources {
    std::unique_ptr<::grpc::Server> server;
    std::unique_ptr<::grpc::AsyncGenericService> service;
    std::vector<std::unique_ptr<Queue>> queues;
    std::vector<std::shared_ptr<Link>> links;
    absl::flat_hash_map<int, std::shared_ptr<::grpc::Channel>> channels;
    std::unique_ptr<tether::internal::SerialExecutor> tasks;
  };

  // The skeleton's hooks (backends/common/agent_skeleton.h).
  bool on_own_thread() const { return t_completion_of == this; }
  void take_resources(Resources& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void close_resources(Resources& resources);
  // A queue thread cannot join itself, nor wait for the streams it
  // completes: the skeleton runs this on a thread of its own then.
  void join_resources(Resources& resources) ABSL_LOCKS_EXCLUDED(mu_);
  Future<Message> start_send(const common::Peer& peer, Message request,
                             PendingRequests::Request pending);
  void run_deferred_later(Incoming::Deferred deferred);
  static absl::StatusOr<std::string> address_of(const std::string& published) {
    return published;
  }

  // Runs `task` on the agent's task thread; false once shut down.
  bool post(std::function<void(AgentState&)> task) ABSL_LOCKS_EXCLUDED(mu_);

  // An open link to `rank` (a new client link if there is none), with
  // request `id` bound to it; nullptr if the request is no longer pending.
  std::shared_ptr<Link> link_for(int rank, int64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<Link> add_link(int rank, const std::string& name,
                                 bool is_client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void open_stream(const std::shared_ptr<Link>& link,
                   std::shared_ptr<::grpc::Channel> channel,
                   ::grpc::CompletionQueue* queue);
  // The queue of `link`'s stream.
  ::grpc::ServerCompletionQueue* queue_of(const Link& link) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queues_[link.connection() % queues_.size()]->queue.get();
  }
  std::shared_ptr<::grpc::Channel> make_channel(
      const std::string& address) const;

  void send_response(const std::weak_ptr<Link>& link, int64_t id,
                     const absl::StatusOr<Message>& result);

  absl::Status start_server();

  const Settings settings_;
  // This worker's "host:port" (set by start_server()); peers_ holds each
  // peer's.
  std::string my_address_;
  std::shared_ptr<::grpc::ChannelCredentials> channel_credentials_;

  // Per rank, its links (usually one; two if both sides opened at once).
  absl::flat_hash_map<int, std::vector<std::shared_ptr<Link>>> links_
      ABSL_GUARDED_BY(mu_);
  // Links whose stream has not retired yet (shutdown waits).
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int, std::shared_ptr<::grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // Ended client streams: deleted on the task thread, or at shutdown, not
  // on the queue thread inside their last completion (and a stream's
  // context may hold the last reference to a channel).
  std::vector<std::unique_ptr<Stream>> retired_streams_ ABSL_GUARDED_BY(mu_);
  // Requests given a second stream after theirs ended in the handshake
  // (on_link_done), while they are pending.
  absl::flat_hash_set<int64_t> resent_ ABSL_GUARDED_BY(mu_);
  PendingRequests::Connection next_connection_ ABSL_GUARDED_BY(mu_) = 1;
  std::unique_ptr<::grpc::AsyncGenericService> service_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<::grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
  // Runs the requests that arrived before start() and deletes ended client
  // streams.
  std::unique_ptr<tether::internal::SerialExecutor> tasks_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tether::backends::grpc::internal

#endif  // TETHER_BACKENDS_GRPC_INTERNAL_AGENT_STATE_H_
