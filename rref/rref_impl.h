// The RRef layer's internals: owner and user references, and the per-worker
// ContextState that runs the protocol (its bodies in rref_impl.cc). Used by
// rref/ and by the layers above that act on an RRef's owner
// (autograd/rref_backward.cc); not by applications (rref/rref.h is theirs).
//
// Protocol (the guarantees of PyTorch's RRef design note):
//   - An RRef has a global id (RRefId, made by its creator) and each user
//     reference a ForkId. The owner keeps, per RRef, the set of forks it
//     knows; it frees its value when the last fork is deleted.
//   - remote(): the caller makes a UserRRef, pending until the owner's ACK
//     of REMOTE_CALL, which registers the caller's fork.
//   - The owner sending its RRef: it registers the new fork before sending,
//     so the receiving user is confirmed at once.
//   - A user sending its RRef (to a third worker): it keeps the RRef as a
//     pending child until the owner confirms the child; the child sends
//     RREF_FORK_REQUEST to the owner, and after its ACK, RREF_CHILD_ACCEPT to
//     the parent, which lets go. The fork graph stays a tree.
//   - A user sending the RRef back to its owner: the owner answers the parent
//     with RREF_CHILD_ACCEPT directly (that fork is never registered).
//   - A UserRRef's destructor sends RREF_USER_DELETE; unconfirmed users are
//     held by the context, so deletion never overtakes confirmation.
//   - A callee runs a function only after every RRef among its arguments is
//     confirmed (Worker::set_call_gate); while it runs, those users are in
//     use: a graceful shutdown lets go of them only after it.
//   - Control messages are idempotent and retried with backoff; user calls
//     (REMOTE_CALL) are never retried.
#ifndef TETHER_RREF_RREF_IMPL_H_
#define TETHER_RREF_RREF_IMPL_H_

#include <ATen/core/ivalue.h>
#include <ATen/core/rref_interface.h>
#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/hash/hash.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/future.h"
#include "core/message.h"
#include "core/toolkit/lifeline.h"
#include "core/toolkit/timer.h"
#include "core/wire/codec.h"
#include "core/worker.h"
#include "rref/messages.h"
#include "rref/rref.h"

namespace tether::rref {

struct GloballyUniqueId {
  int32_t worker = -1;
  int64_t local = -1;

  friend bool operator==(const GloballyUniqueId& a, const GloballyUniqueId& b) {
    return a.worker == b.worker && a.local == b.local;
  }
  template <typename H>
  friend H AbslHashValue(H h, const GloballyUniqueId& id) {
    return H::combine(std::move(h), id.worker, id.local);
  }
  std::string str() const;
};
using RRefId = GloballyUniqueId;
using ForkId = GloballyUniqueId;

class ContextState;

inline constexpr char kCreationFailed[] = "RRef creation failed";
// The longest an owner waits for a value that is not there yet.
inline constexpr absl::Duration kMaxValueWait = absl::Seconds(60);

// `status` as the failure of an RRef's creation, said once.
absl::Status creation_failure(const absl::Status& status);

class RRefImpl : public c10::RRefInterface {
 public:
  RRefImpl(std::shared_ptr<ContextState> context, WorkerInfo owner, RRefId id,
           c10::TypePtr type);

  c10::worker_id_t owner() const override {
    return static_cast<c10::worker_id_t>(owner_.id);
  }
  std::string ownerName() const override { return owner_.name; }
  const c10::TypePtr type() const override { return type_; }

  const WorkerInfo& owner_info() const { return owner_; }
  const RRefId& id() const { return id_; }
  const std::shared_ptr<ContextState>& context() const { return context_; }

 private:
  const std::shared_ptr<ContextState> context_;
  const WorkerInfo owner_;
  const RRefId id_;
  const c10::TypePtr type_;
};

class OwnerRRef final : public RRefImpl {
 public:
  using RRefImpl::RRefImpl;

  bool isOwner() const override { return true; }
  bool confirmedByOwner() const override { return true; }

  // Completes once the value is set (or its creation failed).
  Future<c10::IValue> value() const { return value_.future(); }
  void set_value(absl::StatusOr<c10::IValue> value) const {
    value_.set(std::move(value));
  }

 private:
  Promise<c10::IValue> value_;
};

class UserRRef final : public RRefImpl {
 public:
  UserRRef(std::shared_ptr<ContextState> context, WorkerInfo owner, RRefId id,
           ForkId fork_id, c10::TypePtr type);
  // Tells the owner (RREF_USER_DELETE), unless the worker is gone.
  ~UserRRef() override;

  bool isOwner() const override { return false; }
  bool confirmedByOwner() const override {
    return confirmed_.is_set() && confirmed_.future().result().ok();
  }

  const ForkId& fork_id() const { return fork_id_; }
  // OK once the owner registered this user; an error if creation failed.
  Future<bool> confirmation() const { return confirmed_.future(); }
  void confirm(absl::Status status) const;

 private:
  const ForkId fork_id_;
  Promise<bool> confirmed_;
};

// The protocol state of one worker. Shared with every RRef it made, which
// may outlive the worker: once closed, it does nothing.
class ContextState : public wire::ReferenceHook,
                     public std::enable_shared_from_this<ContextState> {
 public:
  explicit ContextState(Worker& worker)
      : worker_(worker), self_(worker.get_current_worker_info()) {}

  // The worker is going away; waits for calls into it to finish.
  void close();

  const WorkerInfo& self() const { return self_; }

  // Runs `fn` with the worker unless closed (then returns false).
  template <typename F>
  bool with_worker(F fn) {
    return worker_.use(std::move(fn));
  }

  GloballyUniqueId new_id() { return {self_.id, next_local_++}; }

  absl::StatusOr<WorkerInfo> worker_info(int32_t id);

  // ---- owner side

  c10::intrusive_ptr<OwnerRRef> get_or_create_owner(const RRefId& id,
                                                    const c10::TypePtr& type);

  void add_fork(const RRefId& id, const ForkId& fork);

  // Drops a fork; the owner lets go of the value with the last one: the
  // owner is returned then (its caller drops it, outside the lock).
  [[nodiscard]] c10::intrusive_ptr<OwnerRRef> delete_fork(const RRefId& id,
                                                          const ForkId& fork);

  void release_if_unforked(const RRefId& id);

  // ---- control messages: idempotent, retried with backoff

  void send_control(const WorkerInfo& to, MessageType type, c10::IValue payload,
                    std::function<void(absl::Status)> done = nullptr,
                    int attempt = 0);

  // ---- the codec hook

  absl::StatusOr<wire::RRefForkData> fork(
      const c10::intrusive_ptr<c10::RRefInterface>& rref) override;

  absl::StatusOr<c10::intrusive_ptr<c10::RRefInterface>> adopt(
      const wire::RRefForkData& data) override;

  void add_pending_user(const c10::intrusive_ptr<UserRRef>& user);

  // Confirms (or fails) a pending user and stops holding it.
  void finish_pending_user(const ForkId& fork, absl::Status status);

  void user_created(const RRefId& id, const ForkId& fork,
                    const WorkerInfo& owner);

  void user_deleted(const RRefId& id, const ForkId& fork,
                    const WorkerInfo& owner);

  // Graceful shutdown: tells the owners of every user reference still held
  // here that it is gone; later use of those references fails cleanly.
  //
  // Users that a value owned here holds (a remote() whose function returned
  // RRefs) stay: a peer may still fetch that value and fork them, and the
  // owner must not let go of theirs meanwhile. They are released when that
  // value goes, as any user.
  //
  // Users not settled yet stay until they are: one whose owner has not
  // confirmed it (its REMOTE_CALL or RREF_FORK_REQUEST may still be on the
  // way: a delete could overtake it), and one with a child the owner has
  // not confirmed (the child's RREF_FORK_REQUEST may still be on the way:
  // the owner, told first that this user is gone, would let go of the
  // value the child is about to fetch). Each is released when it settles.
  void release_all_users();

  // After the drain: RRefs owned here that still have users.
  absl::Status leak_report();

  // ---- handlers (on the worker pool)

  // A call target: a function's name, or (RRef owned here, method name).
  static absl::Status check_target(const c10::IValue& target);

  static std::string describe_target(const c10::IValue& target);

  absl::StatusOr<c10::IValue> invoke(const c10::IValue& target,
                                     std::vector<c10::IValue> args,
                                     const Kwargs& kwargs);

  // Runs a decoded (target, args, kwargs, ...) call once its RRef arguments
  // are confirmed; errors name this worker and the target.
  absl::StatusOr<c10::IValue> run_call(const c10::IValue& call);

  static absl::Status check_call(const c10::IValue& call, size_t size,
                                 absl::string_view what);

  // Served on arrival (HandlerTraits::serve_on_arrival), as a CALL is: a
  // builtin operator on small tensors runs on the agent's thread, anything
  // else on the pool (Worker::runs_on_arrival, and never one with RRef
  // arguments: contains_rref).
  Future<Message> on_remote_call(Message request);
  // Decodes and checks a REMOTE_CALL; runs it here, or on the pool.
  Future<Message> remote_call(const Message& request);
  // Makes (or finds) the owner of a checked REMOTE_CALL, runs it and gives
  // the owner its value.
  Future<Message> run_remote_call(const c10::IValue& call,
                                  const wire::ContextMeta& autograd);
  // Serves `serve` on the worker's pool (Worker::serve_on_pool); CANCELLED
  // once the worker or this state is gone.
  Future<Message> on_pool(std::function<Future<Message>(ContextState&)> serve);

  // A call's result as a Future (a function that answers later completes
  // it then); a later error names this worker and the target as
  // run_call's do.
  Future<c10::IValue> settle_call(const c10::IValue& call,
                                  absl::StatusOr<c10::IValue> result);

  Future<Message> on_method_call(Message request);

  // (rref_worker, rref_local, wait_ms): the value, once there. The owner
  // waits at most wait_ms (the fetcher's own timeout) for a value that is
  // not there yet; if its REMOTE_CALL never arrived by then, the RRef is
  // failed and let go, so nothing waits or leaks forever. Served on
  // arrival: it never blocks (an oversized request goes to the pool).
  Future<Message> on_fetch(Message request);
  Future<Message> fetch(const Message& request);

  // A fetch waited `wait` for RRef `id`'s value: if its REMOTE_CALL never
  // came, the RRef fails and, without users, is let go.
  void fail_valueless(const RRefId& id, absl::Duration wait);

  // Served on arrival (HandlerTraits::serve_on_arrival); an oversized
  // request, and a value whose destruction may run Python, go to the pool.
  Future<Message> on_user_delete(Message request);
  Future<Message> user_delete(const Message& request);

  Future<Message> on_fork_request(Message request);

  Future<Message> on_child_accept(Message request);

  // Waits until every RRef among a call's arguments is confirmed, then
  // counts the users among them in use until the returned pass is dropped
  // (release_all_users() keeps them meanwhile).
  absl::StatusOr<std::shared_ptr<void>> admit(const c10::IValue& call);

  // Decodes through the worker: RRefs with this hook, and a message in a
  // distributed autograd context through the autograd hook.
  absl::StatusOr<c10::IValue> decode_with_hook(
      const Message& message, wire::ContextMeta* autograd = nullptr);

  // The response to a request that came with `request` autograd metadata.
  absl::Status encode_response(const c10::IValue& value,
                               const wire::ContextMeta& request, Message& out);

  // run_call in the autograd context the request came with.
  absl::StatusOr<c10::IValue> run_call_serving(
      const c10::IValue& call, const wire::ContextMeta& autograd);

  RRefDebugInfo debug_info();

  // After close(): lets go of the references it held, outside the lock.
  void drop_closed_users();

 private:
  absl::StatusOr<std::vector<int64_t>> control_ints(const Message& request,
                                                    size_t n);

  tether::internal::Lifeline<Worker> worker_;
  absl::Mutex mu_;
  const WorkerInfo self_;
  // From 0, as the peer's ids (its tests print them).
  std::atomic<int64_t> next_local_{0};
  absl::flat_hash_map<RRefId, c10::intrusive_ptr<OwnerRRef>> owners_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<RRefId, absl::flat_hash_set<ForkId>> forks_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ForkId, c10::intrusive_ptr<UserRRef>> pending_users_
      ABSL_GUARDED_BY(mu_);
  struct LiveUser {
    RRefId id;
    WorkerInfo owner;
  };
  // Every UserRRef alive here that has not been released.
  absl::flat_hash_map<ForkId, LiveUser> live_users_ ABSL_GUARDED_BY(mu_);
  std::vector<c10::intrusive_ptr<RRefImpl>> dropped_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ForkId, c10::intrusive_ptr<RRefImpl>> pending_children_
      ABSL_GUARDED_BY(mu_);
  // Users release_all_users() kept because they were not settled: released
  // once confirmed, without pending children and not in use.
  absl::flat_hash_set<ForkId> release_when_settled_ ABSL_GUARDED_BY(mu_);
  // Users among the arguments of calls running here (admit()), counted.
  absl::flat_hash_map<ForkId, int> users_in_use_ ABSL_GUARDED_BY(mu_);
  void done_using(const std::vector<ForkId>& forks);

  // A user of release_when_settled_ that has settled: stops counting it as
  // live and returns it, for the caller to tell its owner outside the lock.
  std::optional<std::pair<ForkId, LiveUser>> take_settled(const ForkId& fork)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool settled(const ForkId& fork) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void tell_deleted(const ForkId& fork, const LiveUser& user);
  internal::TimerQueue timers_;
};

// The RRef layer of one Worker (rref_extension()): owns its ContextState.
class RRefExtension final : public WorkerExtension {
 public:
  RRefExtension(Worker& worker, RRefOptions options)
      : options_(options), state_(std::make_shared<ContextState>(worker)) {}

  // Not before: a call this worker still serves for a worker that has not
  // begun its shutdown may hold a user (one it made, e.g. rpc.remote()
  // then to_here()); released, its owner would let the value go under it.
  void on_group_joined() override { state_->release_all_users(); }

  absl::Status after_graceful_join() override {
    return options_.leak_check ? state_->leak_report() : absl::OkStatus();
  }
  ~RRefExtension() override {
    state_->close();
    state_->drop_closed_users();
  }

  wire::ReferenceHook* reference_hook() override { return state_.get(); }

  const std::shared_ptr<ContextState>& state() const { return state_; }

 private:
  const RRefOptions options_;
  std::shared_ptr<ContextState> state_;
};

// Whether `value` holds an RRef anywhere (containers and pickled objects
// included): a call with one waits at the call gate for its owner's
// confirmation, so it runs on the pool.
bool contains_rref(const c10::IValue& value);

// Calls `fn` on `rref`'s owner from the worker `rref` belongs to
// (FAILED_PRECONDITION once that worker is shut down).
Future<c10::IValue> rpc_async_to_owner(const RRef& rref, absl::string_view fn,
                                       std::vector<c10::IValue> args,
                                       absl::Duration timeout);

// The RRef context of the worker serving the calling thread (or the
// default worker), or FAILED_PRECONDITION.
absl::StatusOr<std::shared_ptr<ContextState>> current_context();
absl::StatusOr<std::shared_ptr<ContextState>> context_of(Worker* worker);

}  // namespace tether::rref

#endif  // TETHER_RREF_RREF_IMPL_H_
