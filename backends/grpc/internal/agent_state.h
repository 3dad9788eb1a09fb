// The gRPC agent's state over the agent skeleton
// (backends/common/agent_skeleton.h): its server, channels and links, the
// completion threads that deliver what links receive. grpc_agent.cc builds
// it; internal/link.h holds the streams.
//
// Ownership: held by a shared_ptr; links and reactors hold it weakly.
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
#include <vector>

#include "backends/common/agent_skeleton.h"
#include "backends/grpc/internal/link.h"
#include "backends/grpc/internal/settings.h"
#include "core/internal/serial_executor.h"

namespace tether::backends::grpc_internal {

inline constexpr common::BackendNames kGrpcNames{"grpc", "gRPC",
                                                 "tether/grpc/"};

// Everything an agent's callbacks touch. Callbacks hold it weakly: a
// callback that fires after the agent is gone finds nothing and returns.
class AgentState
    : public common::AgentSkeleton<AgentState, std::weak_ptr<Link>> {
 public:
  AgentState(AgentSetup setup, Settings settings)
      : AgentSkeleton(setup, kGrpcNames), settings_(std::move(settings)) {
    for (int i = 0; i < settings_.completion_threads; ++i) {
      completion_.push_back(
          std::make_unique<tether::internal::SerialExecutor>());
    }
  }

  ~AgentState() {
    // WARNING: this may run on a gRPC thread (a reaction held the last
    // reference); shutdown() has already taken every gRPC object and thread
    // out of here, so nothing below joins a thread.
  }

  absl::Status init();
  void remove_peer(const WorkerInfo& worker) ABSL_LOCKS_EXCLUDED(mu_);

  // For the service: the reactor of an incoming stream.
  ::grpc::ServerGenericBidiReactor* accept(
      ::grpc::GenericCallbackServerContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  // For links: a message arrived whole on `link`.
  void on_received(const std::shared_ptr<Link>& link, Received received);
  // For links: `link`'s stream is gone, `why`. `client` (a client
  // stream's reactor) is deleted later, off gRPC's threads.
  void on_link_done(const std::shared_ptr<Link>& link, absl::string_view why,
                    absl::StatusCode code, std::unique_ptr<Stream> client)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class AgentSkeleton<AgentState, std::weak_ptr<Link>>;

  // What shutdown() takes out of the state, closes and joins, outside the
  // lock (the skeleton's hooks below).
  struct Resources {
    std::unique_ptr<::grpc::Server> server;
    std::unique_ptr<::grpc::CallbackGenericService> service;
    std::vector<std::shared_ptr<Link>> links;
    absl::flat_hash_map<int, std::shared_ptr<::grpc::Channel>> channels;
    std::vector<std::unique_ptr<tether::internal::SerialExecutor>> completion;
  };

  // The skeleton's hooks (backends/common/agent_skeleton.h).
  bool on_own_thread() const {
    return t_reaction_of == this || t_completion_of == this;
  }
  void take_resources(Resources& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void close_resources(Resources& resources);
  // gRPC's server waits for the reaction this thread may be in, and a
  // completion thread cannot join itself: the skeleton runs this on a
  // thread of its own then.
  void join_resources(Resources& resources) ABSL_LOCKS_EXCLUDED(mu_);
  Future<Message> start_send(const common::Peer& peer, Message request,
                             PendingRequests::Request pending);
  void run_deferred_later(Incoming::Deferred deferred);
  static absl::StatusOr<std::string> address_of(const std::string& published) {
    return published;
  }

  // Runs `task` on `link`'s completion thread; false once shut down.
  bool post(const Link& link, std::function<void(AgentState&)> task)
      ABSL_LOCKS_EXCLUDED(mu_);

  // An open link to `rank` (a new client link if there is none), with
  // request `id` bound to it; nullptr if the request is no longer pending.
  std::shared_ptr<Link> link_for(int rank, int64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<Link> add_link(int rank, const std::string& name,
                                 bool is_client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void open_stream(const std::shared_ptr<Link>& link,
                   std::shared_ptr<::grpc::Channel> channel);
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
  // Links whose reactor has not had its OnDone yet (shutdown waits).
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int, std::shared_ptr<::grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // Reactors of ended client streams. WARNING: gRPC must not destroy a
  // channel inside one of its callbacks, where streams end, and a reactor
  // (its context) may hold the last reference to one: they are deleted on a
  // completion thread, or at shutdown.
  std::vector<std::unique_ptr<Stream>> retired_streams_ ABSL_GUARDED_BY(mu_);
  // Requests given a second stream after theirs ended in the handshake
  // (on_link_done), while they are pending.
  absl::flat_hash_set<int64_t> resent_ ABSL_GUARDED_BY(mu_);
  PendingRequests::Connection next_connection_ ABSL_GUARDED_BY(mu_) = 1;
  std::unique_ptr<::grpc::CallbackGenericService> service_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<::grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<tether::internal::SerialExecutor>> completion_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tether::backends::grpc_internal

#endif  // TETHER_BACKENDS_GRPC_INTERNAL_AGENT_STATE_H_
