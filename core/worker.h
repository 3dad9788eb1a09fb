// Worker: one member of an RPC group, and the public API of tether's core.
//
// A Worker owns one Agent (chosen by backend name from a BackendRegistry),
// the callables it serves and a thread pool that runs them (a small call of
// a builtin operator runs on the agent thread it arrived on). Several Workers
// may live in one process (tests do this); the free functions of
// core/rpc.h act on the process's default Worker, or on the Worker whose
// request the calling thread is serving.
//
// Ownership: create() returns the only owner. Destroying a Worker shuts it
// down (not gracefully) first.
//
// Thread safety: every method may be called from any thread. Futures from
// rpc_async complete on an agent thread; their callbacks must not block.
#ifndef TETHER_CORE_WORKER_H_
#define TETHER_CORE_WORKER_H_

#include <ATen/core/ivalue.h>
#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/agent.h"
#include "core/backend_registry.h"
#include "core/callables.h"
#include "core/future.h"
#include "core/native_function.h"
#include "core/rendezvous.h"  // kDynamicGroup, for callers of create()
#include "core/toolkit/lifeline.h"
#include "core/wire/codec.h"
#include "core/wire/profiled.h"
#include "core/worker_extension.h"

namespace at {
class ThreadLocalState;
}  // namespace at

namespace c10 {
class ThreadPool;
}  // namespace c10

namespace c10d {
class Store;
}  // namespace c10d

namespace tether::join {
class MembershipToken;
}  // namespace tether::join


namespace tether {

namespace internal {
class CollectiveState;
}  // namespace internal

// Passed as a timeout: use RpcOptions::default_timeout.
inline constexpr absl::Duration kDefaultTimeout = absl::Seconds(-1);

struct RpcOptions {
  // The backend's name in the registry.
  std::string backend = "tensorpipe";
  // Where the group meets; see core/rendezvous.h.
  std::string init_method = "env://";
  // Threads that run incoming calls.
  int num_worker_threads = 16;
  // Bound of every call that does not give its own; zero means none.
  absl::Duration default_timeout = absl::Seconds(60);
  // Bound of the rendezvous at init.
  absl::Duration init_timeout = absl::Seconds(60);
  // Bound of the graceful shutdown barrier; zero or infinite: none (the
  // default). Waiting for workers that are alive and still working is
  // correct however long it takes; a lost worker ends the wait within
  // peer_timeout, naming it.
  absl::Duration shutdown_timeout = absl::InfiniteDuration();
  // How long a peer may leave a liveness probe unanswered before it counts
  // as lost (a stopped or unreachable process; a killed one is found at
  // once, by its refused connection). Long enough for a peer stopped by a
  // debugger or a scheduler for half a minute.
  absl::Duration peer_timeout = absl::Seconds(60);
  // How long a thread that waits keeps polling before it sleeps: the
  // backend's thread that waits for messages (after its last one), and a
  // thread waiting for a future (Future::wait, rpc_sync), which then takes
  // the result without being woken. Each wake-up of a sleeping thread
  // costs tens of microseconds, and on an idle virtual machine about a
  // hundred (docs/benchmarks.md). By default waiting threads poll for
  // `spare_core_poll`, but only while no thread of the machine waits for a
  // core (core/toolkit/poll_policy.h): then polling takes a core nobody
  // wants; when cores are busy it would take one from the thread producing
  // the answer, and a wake-up is cheap. `busy_poll` (zero by default), when
  // set, polls that long whatever the load, spending a core; it overrides
  // `spare_core_poll`. Zero for both: sleep at once. The future's wait is
  // process-wide: the longest any worker of the process asked for.
  absl::Duration busy_poll = absl::ZeroDuration();
  absl::Duration spare_core_poll = absl::Microseconds(100);
  // Per-backend settings, "key" -> "value"; each backend documents its keys.
  absl::flat_hash_map<std::string, std::string> backend_settings;
  // TorchScript sources compiled at init, before this worker serves: peers
  // may call their functions as soon as their own init_rpc returns.
  std::vector<std::string> scripts;
  // What one message may hold (payload bytes, tensors, tensor bytes, nesting
  // depth, values). This worker refuses to send more (RESOURCE_EXHAUSTED
  // to its caller) and refuses to take more: a request over them fails at
  // its caller with RESOURCE_EXHAUSTED naming the limit ("worker 'b'
  // refuses a CALL: a payload of ... is over the limit max_payload_bytes
  // ..."), a response over them fails this worker's call the same way, and
  // the connection keeps serving both ways: the refused message's bytes are
  // skipped without being held (see core/message.h, MessageLimits).
  // Nesting (max_depth) is counted alike by this worker's encoder and its
  // peers' decoders over the whole message: a call's arguments sit 2 deep
  // (the call tuple, the args tuple), so with the default 64 an argument
  // may nest 62 deep; deeper is RESOURCE_EXHAUSTED "... nested deeper than
  // 64 (the limit max_depth ...)", from this worker before it sends or
  // from the callee ("Error on worker ...").
  wire::Limits limits;
  // The secret peers prove they share when they connect (core/auth); empty:
  // the environment variable TETHER_AUTH_SECRET, and if that is unset too,
  // no authentication. Every worker of a group must agree.
  std::string auth_secret;
  // Calls (rpc_*, remote, to_here, proxy calls) this worker may have in
  // flight at once; more fail at once with RESOURCE_EXHAUSTED. 0: no bound.
  int max_calls_in_flight = 0;
  // A dynamic group's worker that replaces its own lost incarnation (the
  // same name and rank, known dead: its launcher reaped it, as tether_run
  // --elastic does before it starts the rank again). Its join takes over
  // the claims the lost one left, and each member drops the lost one's
  // connections and takes the new one in its place. false: the
  // environment variable TETHER_REJOIN=1 sets it. A worker with the name
  // still alive is not to be given it: they would take each other's place.
  bool rejoin = false;
};

// Who to call: a worker's name, its rank, or its WorkerInfo.
class To {
 public:
  To(const char* name) : target_(std::string(name)) {}          // NOLINT
  To(std::string name) : target_(std::move(name)) {}            // NOLINT
  To(absl::string_view name) : target_(std::string(name)) {}    // NOLINT
  To(int rank) : target_(rank) {}                               // NOLINT
  To(WorkerInfo info) : target_(std::move(info)) {}             // NOLINT

  const std::variant<std::string, int, WorkerInfo>& target() const {
    return target_;
  }

 private:
  std::variant<std::string, int, WorkerInfo> target_;
};

class Worker {
 public:
  // Joins the group and starts serving. A negative rank or world size is
  // read from the environment (core/rendezvous.h); world size
  // kDynamicGroup joins a dynamic group instead (see shutdown() and
  // docs/reliability.md). Errors come from the rendezvous
  // (core/rendezvous.h), the membership token (core/join/membership.h),
  // the registry (NOT_FOUND for an unknown backend, FAILED_PRECONDITION for
  // one not viable here) and the backend.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Worker>> create(
      const std::string& name, int rank, int world_size,
      const RpcOptions& options, const BackendRegistry& registry,
      const std::vector<ExtensionFactory>& extensions = {});

  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Calls `fn` (an operator or TorchScript function name) on `to`.
  // Errors: NOT_FOUND for an unknown worker or function, INVALID_ARGUMENT for
  // arguments that do not fit the schema, DEADLINE_EXCEEDED past `timeout`,
  // UNAVAILABLE for a lost peer, CANCELLED after shutdown, UNKNOWN for an
  // exception raised by the function. Remote errors name the worker and
  // the function.
  Future<c10::IValue> rpc_async(const To& to, absl::string_view fn,
                                std::vector<c10::IValue> args,
                                Kwargs kwargs = {},
                                absl::Duration timeout = kDefaultTimeout);

  [[nodiscard]] absl::StatusOr<c10::IValue> rpc_sync(
      const To& to, absl::string_view fn, std::vector<c10::IValue> args,
      Kwargs kwargs = {}, absl::Duration timeout = kDefaultTimeout);

  // Graceful: waits until every worker of the group has called shutdown and
  // no call is in flight anywhere, then stops. Otherwise stops at once.
  // Calls afterwards fail with CANCELLED. Idempotent. `timeout` bounds the
  // graceful wait (kDefaultTimeout: RpcOptions::shutdown_timeout; zero or
  // infinite: none); past it the worker stops anyway and the result is
  // DEADLINE_EXCEEDED (torch.distributed.rpc's shutdown(timeout=)).
  // In a dynamic group a graceful shutdown leaves the group, the others
  // running on: under the membership token (core/join/membership.h) it
  // tells every member, each of which stops new calls to this worker and
  // answers once its calls to it in flight have completed; then this
  // worker waits for its own calls and those it serves, and stops. A
  // member lost meanwhile (its transport fails, or it leaves a probe
  // unanswered for the peer timeout) is dropped from the group, not waited
  // for; `timeout` does not bound leaving.
  [[nodiscard]] absl::Status shutdown(
      bool graceful = true, absl::Duration timeout = kDefaultTimeout);

  // The bound of calls that do not give their own (kDefaultTimeout), as
  // RpcOptions::default_timeout set it at first; zero means none. Setting
  // it affects later calls only (torch.distributed.rpc's
  // get_rpc_timeout / _set_rpc_timeout).
  absl::Duration rpc_timeout() const;

  // The worker pool's threads and how many of them are idle now (the
  // peer's agent.thread_pool_size and agent.num_idle_threads).
  struct PoolInfo {
    int64_t threads = 0;
    int64_t idle = 0;
  };
  PoolInfo pool_info() const;
  void set_rpc_timeout(absl::Duration timeout);

  // Subset collectives (the peer's _all_gather and _barrier): every worker
  // of `names` (empty: the whole group; it must include this one) calls
  // the same sequence of them over the same set. all_gather returns each
  // one's `value` by name once all have given theirs; barrier returns once
  // all have arrived. The wait is bounded by liveness, as the shutdown
  // barrier is: a worker of the set that is lost (no answer to a probe
  // within RpcOptions::peer_timeout) ends it with UNAVAILABLE naming it,
  // however long the others take; `timeout` (zero or infinite: none, the
  // default) bounds it in time too (DEADLINE_EXCEEDED). Errors:
  // INVALID_ARGUMENT if `names` leaves this worker out, NOT_FOUND for an
  // unknown name, CANCELLED after shutdown. `value` must be a wire value.
  [[nodiscard]] absl::StatusOr<std::map<std::string, c10::IValue>> all_gather(
      c10::IValue value, std::vector<std::string> names = {},
      absl::Duration timeout = absl::InfiniteDuration());
  [[nodiscard]] absl::Status barrier(
      std::vector<std::string> names = {},
      absl::Duration timeout = absl::InfiniteDuration());

  // TorchScript functions that peers may call on this worker.
  [[nodiscard]] absl::Status register_script(const std::string& source);

  // A C++ function or lambda that peers may call on this worker by `name`
  // (core/native_function.h: arguments converted from IValues and checked,
  // INVALID_ARGUMENT naming the one that does not fit). It may return a
  // tether::Future: the caller is answered when that completes, and no pool
  // thread waits for it meanwhile. Callable at any time; a name registered
  // after peers started calling it is NOT_FOUND for the calls before.
  // Errors as Callables::add_function.
  //
  //   absl::Status added = worker.register_function(
  //       "my_add", [](at::Tensor a, at::Tensor b) { return a + b; });
  template <typename F>
  [[nodiscard]] absl::Status register_function(std::string name, F f) {
    if constexpr (std::is_same_v<std::decay_t<F>, NativeFunction>) {
      return callables_.add_function(std::move(name), std::move(f));
    } else {
      return callables_.add_function(std::move(name),
                                     native_function(std::move(f)));
    }
  }

  // In a dynamic group (world size kDynamicGroup) these see the group as
  // it is now: a worker that joined is known from the moment its init
  // returns, one that left is gone once its graceful shutdown has begun
  // telling the members (UNAVAILABLE naming it: "has left the group").
  [[nodiscard]] absl::StatusOr<WorkerInfo> get_worker_info(
      const To& to) const;
  const WorkerInfo& get_current_worker_info() const;
  // A copy: in a dynamic group the members change.
  std::vector<WorkerInfo> get_all_worker_infos() const;
  // Where `worker` listens, if its transport has an ip and a port
  // (Agent::endpoint_of). Blocks briefly: not on an agent thread.
  [[nodiscard]] absl::StatusOr<std::optional<Endpoint>> endpoint_of(
      const WorkerInfo& worker) const {
    return agent_->endpoint_of(worker);
  }
  // How this worker's agent reaches `worker` (Agent::link_to). Blocks
  // briefly: not on an agent thread.
  [[nodiscard]] absl::StatusOr<PeerLink> link_to(
      const WorkerInfo& worker) const {
    return agent_->link_to(worker);
  }
  // Whether this worker joined a dynamic group.
  bool is_dynamic() const { return dynamic_; }

  // The Worker serving the request that runs on this thread, or null.
  static Worker* serving();

  // ---- For layers above core (core/worker_extension.h), not users. ----

  // The extension of type T, or null.
  template <typename T>
  T* extension() const {
    for (const auto& e : extensions_) {
      if (auto* t = dynamic_cast<T*>(e.get())) return t;
    }
    return nullptr;
  }

  // Serves requests of `type` with `handler`, run on the worker pool (it may
  // block briefly; it returns the response's future); `traits` say how this
  // worker counts the requests of `type` it sends. Only while an
  // ExtensionFactory runs; INVALID_ARGUMENT for CALL or a taken type.
  [[nodiscard]] absl::Status register_handler(MessageType type,
                                              RequestHandler handler,
                                              HandlerTraits traits = {});

  // Runs after a CALL's arguments are decoded and before the function runs,
  // on the pool thread (a call for which `waits(call)` is true always runs
  // there); an error fails the call with it. Otherwise it returns a pass
  // the worker holds until the call has answered (a function that answers
  // later: until then). A layer of references waits
  // here until the owner has confirmed every reference among the
  // arguments, and its pass keeps them in use (a graceful shutdown does not
  // let go of them meanwhile). `call` is the decoded (name, args, kwargs)
  // tuple. Only while an ExtensionFactory runs.
  using CallPass = std::shared_ptr<void>;
  using CallGate =
      std::function<absl::StatusOr<CallPass>(const c10::IValue& call)>;
  using CallGateWaits = std::function<bool(const c10::IValue& call)>;
  void set_call_gate(CallGate gate, CallGateWaits waits);

  // Names under `prefix` (e.g. "py::") are served by `provider`, a layer
  // above core with its own policy (the Python front end). Such calls run
  // on the pool. Only while an ExtensionFactory runs; errors as
  // Callables::add_provider.
  [[nodiscard]] absl::Status add_callable_provider(
      std::string prefix, std::shared_ptr<CallableProvider> provider);

  // Sends a message as is (CANCELLED once stopped). The response is the
  // agent's; an EXCEPTION response becomes its Status.
  Future<Message> send(const WorkerInfo& to, Message message,
                       absl::Duration timeout = kDefaultTimeout);

  const Callables& callables() const { return callables_; }

  // A call's bound: kDefaultTimeout is the options' default, zero none
  // (InfiniteDuration).
  absl::Duration resolve_timeout(absl::Duration timeout) const;

  // Encodes `value` with this worker's reference hook (a control message:
  // no context).
  [[nodiscard]] absl::Status encode(const c10::IValue& value, Message& out);
  // Encodes a request to `to`: inside a context (of this thread, by the
  // context hook), the message belongs to it.
  [[nodiscard]] absl::Status encode_request(const c10::IValue& value,
                                            const WorkerInfo& to, Message& out);
  // Encodes the response to a request that came with `request` metadata:
  // if that request was in a context, so is the response.
  [[nodiscard]] absl::Status encode_response(const c10::IValue& value,
                                             const wire::ContextMeta& request,
                                             Message& out);
  // Decodes with the reference hook; a message in a context goes through
  // the context hook, and `context` (if given) receives its metadata.
  [[nodiscard]] absl::StatusOr<c10::IValue> decode(
      const Message& in, wire::ContextMeta* context = nullptr);

  // Serves a request in the context it came with: while it lives,
  // that context is current on this thread (nested calls belong to it).
  class ServingContext {
   public:
    ServingContext(const Worker& worker, const wire::ContextMeta& request);
    ~ServingContext();
    ServingContext(const ServingContext&) = delete;
    ServingContext& operator=(const ServingContext&) = delete;

   private:
    ContextHook* hook_;
    int64_t previous_ = -1;
  };

  // Whether `request` may be decoded on the agent's thread it arrived on:
  // at most 64 KiB of payload and storages.
  static bool decodes_on_arrival(const Message& request);
  // Whether a call of `fn`, decoded on arrival with `context`, may run
  // there too: a builtin operator (aten::) outside a context, which is
  // cheap and never blocks. Anything else (a user function, TorchScript, a
  // step of distributed autograd) runs on the pool, and so does a call the
  // call gate may wait for (set_call_gate's `waits`, which the Worker asks
  // too; a layer that serves calls of its own asks its own gate).
  static bool runs_on_arrival(absl::string_view fn,
                              const wire::ContextMeta& context);
  // For a handler registered with HandlerTraits::serve_on_arrival: runs
  // `serve` on the pool, as a request's handler (an error becomes an
  // EXCEPTION answer there too), and gives its answer. Called from a
  // handler the Worker called on the pool (a profiled request), it serves
  // right there.
  Future<Message> serve_on_pool(std::function<Future<Message>()> serve);

  // An EXCEPTION message carrying `status`.
  static Message exception_message(const absl::Status& status);
  // The Status an EXCEPTION message carries.
  static absl::Status status_of_exception(const Message& message);

 private:
  Worker(RpcOptions options, std::unique_ptr<Agent> agent);
  // Serves all_gather's calls (core/collective.cc); at create().
  [[nodiscard]] absl::Status start_collectives();
  // OK if `who` answers a probe within options_.peer_timeout, else
  // UNAVAILABLE naming it (core/collective.cc).
  absl::Status probe(const WorkerInfo& who);

  Future<Message> handle_request(Message request);
  // Serves `request`; with `tls`, every thread that does runs under it (a
  // profiled request, below).
  Future<Message> serve_request(Message request,
                                const at::ThreadLocalState* tls = nullptr);
  void run_on_pool(std::function<void()> job, const at::ThreadLocalState* tls);
  // A PROFILED_REQUEST: serves the request it wraps under a profiler with
  // the caller's settings, and answers with what that recorded.
  Future<Message> serve_profiled(Message wrapped);
  // A request served while a process-wide server profile is on
  // (profiling::ServerProfiles): under a profiler with its settings.
  Future<Message> serve_server_profiled(Message request,
                                        const wire::ProfilerSettings& settings);
  // Whether a request of `type` is profiled (CALL, HandlerTraits::profiled).
  bool profiled(MessageType type) const;
  // The agent's send; a request of a profiled type sent from a thread that
  // runs the legacy profiler goes as a PROFILED_REQUEST.
  Future<Message> send_to_agent(const WorkerInfo& to, Message message,
                                absl::Duration timeout);
  // send_counted's work, apart from the in-flight count of dynamic groups.
  Future<Message> send_limited(const WorkerInfo& to, Message message,
                                         absl::Duration timeout);
  // Sends through the agent; a user-level call counts against
  // max_calls_in_flight until it completes.
  Future<Message> send_counted(const WorkerInfo& to, Message message,
                               absl::Duration timeout);
  // RESOURCE_EXHAUSTED if `message` is over options_.limits.
  absl::Status check_limits(const Message& message) const;
  // Takes the hooks `extension` gives (WorkerExtension::reference_hook,
  // context_hook); INVALID_ARGUMENT if another extension gave one already.
  absl::Status take_hooks(WorkerExtension& extension);
  // A CALL, decoded: the (name, args, kwargs) tuple and its parts.
  struct DecodedCall {
    c10::IValue value;
    wire::ContextMeta context;
    std::string fn;
    std::vector<c10::IValue> args;
    Kwargs kwargs;
  };
  Future<Message> process_request(const Message& request);
  // Decodes a CALL into `out`; the EXCEPTION response if it is malformed.
  std::optional<Message> decode_call(const Message& request, DecodedCall& out);
  // Runs a decoded call (after the call gate) and encodes its response;
  // a function that returns a future is answered when that completes.
  Future<Message> run_call(DecodedCall& call);
  // The response to `fn`'s `result`, or the EXCEPTION naming this worker.
  Message response_to(const std::string& fn,
                      const absl::StatusOr<c10::IValue>& result,
                      const wire::ContextMeta& context);

  // ---- Dynamic membership (core/worker_membership.cc). ----
  // Tells every member of `members` (this worker not among them) that this
  // worker joined, under `token`; a member found lost is forgotten.
  // Writes the new member list.
  absl::Status announce_join(join::MembershipToken& token,
                             std::vector<WorkerInfo> members);
  absl::Status leave_group();
  // A MEMBER_JOIN or MEMBER_LEAVE request.
  Future<Message> handle_membership(Message request);
  // Sends a MEMBER_JOIN or MEMBER_LEAVE to each of `to`; the workers found
  // lost (UNAVAILABLE, or silent past the peer timeout) go to `lost`.
  absl::Status tell_members(MessageType type, const std::vector<WorkerInfo>& to,
                            std::vector<WorkerInfo>& lost);
  // Counts a send to `to` in flight (dynamic groups), or fails fast when
  // `to` is not a member.
  absl::Status count_send_to(const WorkerInfo& to);
  void sent_to_done(int rank);

  const RpcOptions options_;
  bool dynamic_ = false;
  // The group's rendezvous store (dynamic groups: leaving takes the
  // membership token there).
  std::shared_ptr<c10d::Store> store_;
  mutable absl::Mutex members_mu_;
  // The group, rank order (a static group's never changes).
  std::vector<WorkerInfo> members_ ABSL_GUARDED_BY(members_mu_);
  // Workers that left (dynamic groups), by name: calls to them fail fast
  // naming them.
  absl::flat_hash_map<std::string, WorkerInfo> left_
      ABSL_GUARDED_BY(members_mu_);
  // Sends in flight per destination rank, and in all (dynamic groups).
  absl::flat_hash_map<int, int64_t> in_flight_to_ ABSL_GUARDED_BY(members_mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(members_mu_) = 0;
  // Requests being served (dynamic groups).
  int64_t serving_ ABSL_GUARDED_BY(members_mu_) = 0;
  // Members that left, waiting for this worker's calls to them to end
  // before they are answered: (rank, what completes the answer).
  std::vector<std::pair<int, std::function<void()>>> drained_waiters_
      ABSL_GUARDED_BY(members_mu_);
  // rpc_timeout() in nanoseconds; -1: none.
  std::atomic<int64_t> default_timeout_ns_;
  Callables callables_;
  // Set while extensions are made; read-only once the worker serves.
  std::vector<std::unique_ptr<WorkerExtension>> extensions_;
  absl::flat_hash_map<MessageType, RequestHandler> handlers_;
  // The types of handlers_ registered with HandlerTraits::serve_on_arrival.
  absl::flat_hash_set<MessageType> served_on_arrival_;
  // The types of handlers_ registered with HandlerTraits::counts_as_call,
  // and with HandlerTraits::profiled.
  absl::flat_hash_set<MessageType> counted_as_calls_;
  absl::flat_hash_set<MessageType> profiled_types_;
  // Given by the extensions (WorkerExtension::reference_hook and
  // context_hook), at most one each.
  wire::ReferenceHook* reference_hook_ = nullptr;
  ContextHook* context_hook_ = nullptr;
  CallGate call_gate_;
  CallGateWaits call_gate_waits_;
  bool building_ = true;
  // Lets a function's future, which may complete after this Worker is
  // gone, find out whether it still is (closed by the destructor).
  std::shared_ptr<internal::Lifeline<Worker>> lifeline_;
  // all_gather's calls this worker leads (core/collective.cc).
  std::shared_ptr<internal::CollectiveState> collectives_;
  std::unique_ptr<c10::ThreadPool> pool_;
  std::unique_ptr<Agent> agent_;
  absl::Mutex mu_;
  // Running -> (graceful) Draining -> Stopped. While draining, calls still
  // go out: an operator being served may call onward (A -> B -> C), and the
  // drain waits for those calls too.
  enum class State { kRunning, kDraining, kStopped };
  State state_ ABSL_GUARDED_BY(mu_) = State::kRunning;
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tether

#endif  // TETHER_CORE_WORKER_H_
