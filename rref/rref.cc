#include "rref/rref.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>

#include "autograd/autograd.h"
#include "core/internal/timer.h"
#include "core/ivalue_future.h"
#include "core/rpc.h"
#include "core/wire/codec.h"
#include "rref/rref_impl.h"

namespace tether {
namespace rref {

std::string GloballyUniqueId::str() const {
  return absl::StrCat(worker, ":", local);
}

namespace {

constexpr int kControlAttempts = 6;
// The longest an owner waits for a value that is not there yet.
constexpr absl::Duration kMaxValueWait = absl::Seconds(60);
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);

bool retryable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

constexpr char kCreationFailed[] = "RRef creation failed";

// `status` as the failure of an RRef's creation, said once.
absl::Status creation_failure(const absl::Status& status) {
  if (absl::StrContains(status.message(), kCreationFailed)) return status;
  return absl::Status(status.code(), absl::StrCat(kCreationFailed, ": ",
                                                  status.message()));
}

c10::IValue ids(std::initializer_list<int64_t> values) {
  std::vector<c10::IValue> elems;
  for (int64_t v : values) elems.emplace_back(v);
  return c10::ivalue::Tuple::create(std::move(elems));
}

// The ints of a control message's tuple payload.
absl::StatusOr<std::vector<int64_t>> ints_of(const c10::IValue& v, size_t n,
                                             absl::string_view what) {
  if (!v.isTuple() || v.toTupleRef().elements().size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", what, ": expected ", n, " ints"));
  }
  std::vector<int64_t> out;
  for (const c10::IValue& e : v.toTupleRef().elements()) {
    if (!e.isInt()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed ", what, ": expected ints"));
    }
    out.push_back(e.toInt());
  }
  return out;
}

Message ack() {
  Message message;
  message.type = MessageType::kAck;
  return message;
}

// Every RRef inside `v` (lists, tuples, dicts).
void collect_rrefs(const c10::IValue& v,
                   std::vector<c10::intrusive_ptr<c10::RRefInterface>>& out) {
  if (v.isRRef()) {
    out.push_back(v.toRRef());
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) collect_rrefs(e, out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) collect_rrefs(e, out);
  } else if (v.isGenericDict()) {
    for (const auto& entry : v.toGenericDict()) {
      collect_rrefs(entry.key(), out);
      collect_rrefs(entry.value(), out);
    }
  }
}

}  // namespace

// The protocol state of one worker. Shared with every RRef it made, which
// may outlive the worker: once closed, it does nothing.
class ContextState : public wire::RRefHook,
                     public std::enable_shared_from_this<ContextState> {
 public:
  explicit ContextState(Worker& worker)
      : worker_(&worker), self_(worker.get_current_worker_info()) {}

  // The worker is going away; waits for calls into it to finish.
  void close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return in_use_ == 0;
    };
    mu_.Await(absl::Condition(&idle));
    worker_ = nullptr;
    owners_.clear();
    forks_.clear();
    // References that are users are dropped outside the lock (by
    // drop_closed_users): their destructors call back in.
    for (auto& [fork, user] : pending_users_) {
      dropped_.push_back(std::move(user));
    }
    pending_users_.clear();
    for (auto& [fork, child] : pending_children_) {
      dropped_.push_back(std::move(child));
    }
    pending_children_.clear();
  }

  const WorkerInfo& self() const { return self_; }

  // Runs `fn` with the worker unless closed (then returns false).
  template <typename F>
  bool with_worker(F fn) {
    Worker* worker;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return false;
      worker = worker_;
      ++in_use_;
    }
    fn(*worker);
    absl::MutexLock lock(&mu_);
    --in_use_;
    return true;
  }

  GloballyUniqueId new_id() { return {self_.id, next_local_++}; }

  absl::StatusOr<WorkerInfo> worker_info(int32_t id) {
    absl::StatusOr<WorkerInfo> info =
        absl::FailedPreconditionError("the worker is shut down");
    with_worker([&](Worker& w) { info = w.get_worker_info(static_cast<int>(id)); });
    return info;
  }

  // ---- owner side

  c10::intrusive_ptr<OwnerRRef> get_or_create_owner(const RRefId& id,
                                                    const c10::TypePtr& type) {
    absl::MutexLock lock(&mu_);
    auto it = owners_.find(id);
    if (it != owners_.end()) return it->second;
    auto owner = c10::make_intrusive<OwnerRRef>(shared_from_this(), self_, id,
                                                type);
    owners_.emplace(id, owner);
    return owner;
  }

  void add_fork(const RRefId& id, const ForkId& fork) {
    absl::MutexLock lock(&mu_);
    forks_[id].insert(fork);
  }

  // Drops a fork; the owner lets go of the value with the last one.
  void delete_fork(const RRefId& id, const ForkId& fork) {
    c10::intrusive_ptr<OwnerRRef> released;
    absl::MutexLock lock(&mu_);
    auto it = forks_.find(id);
    if (it == forks_.end()) return;
    it->second.erase(fork);
    if (it->second.empty()) {
      forks_.erase(it);
      auto owner = owners_.find(id);
      // Without a value yet, its REMOTE_CALL has not run: that handler looks
      // the owner up by id (and lets it go once it has set the value).
      if (owner != owners_.end() && owner->second->value().is_ready()) {
        released = std::move(owner->second);
        owners_.erase(owner);
      }
    }
  }

  void release_if_unforked(const RRefId& id) {
    c10::intrusive_ptr<OwnerRRef> released;
    absl::MutexLock lock(&mu_);
    if (forks_.contains(id)) return;
    auto it = owners_.find(id);
    if (it == owners_.end()) return;
    released = std::move(it->second);
    owners_.erase(it);
  }

  // ---- control messages: idempotent, retried with backoff

  void send_control(const WorkerInfo& to, MessageType type,
                    c10::IValue payload,
                    std::function<void(absl::Status)> done = nullptr,
                    int attempt = 0) {
    Message message;
    message.type = type;
    absl::Status encoded = wire::encode(payload, message);
    if (!encoded.ok()) {
      if (done) done(encoded);
      return;
    }
    std::weak_ptr<ContextState> weak = weak_from_this();
    bool sent = with_worker([&](Worker& worker) {
      worker.send(to, std::move(message))
          .on_complete([weak, to, type, payload, done,
                        attempt](const absl::StatusOr<Message>& response) {
            absl::Status status = response.status();
            auto self = weak.lock();
            if (self != nullptr && retryable(status) &&
                attempt + 1 < kControlAttempts) {
              absl::Duration backoff = kFirstBackoff * (1 << attempt);
              self->timers_.schedule(
                  absl::Now() + backoff, [weak, to, type, payload, done, attempt] {
                    if (auto s = weak.lock()) {
                      s->send_control(to, type, payload, done, attempt + 1);
                    } else if (done) {
                      done(absl::CancelledError("the worker is gone"));
                    }
                  });
              return;
            }
            if (done) done(status);
          });
    });
    if (!sent && done) done(absl::CancelledError("the worker is shut down"));
  }

  // ---- the codec hook

  absl::StatusOr<wire::RRefForkData> fork(
      const c10::intrusive_ptr<c10::RRefInterface>& rref) override {
    auto* impl = dynamic_cast<RRefImpl*>(rref.get());
    if (impl == nullptr || impl->context().get() != this) {
      return absl::InvalidArgumentError(
          "an RRef of another worker cannot be sent from this one");
    }
    if (auto* user = dynamic_cast<UserRRef*>(impl)) {
      Future<bool> confirmation = user->confirmation();
      if (confirmation.is_ready() && !confirmation.result().ok()) {
        return creation_failure(confirmation.result().status());
      }
    }
    wire::RRefForkData data;
    const ForkId fork = new_id();
    data.owner = impl->owner_info().id;
    data.rref_worker = impl->id().worker;
    data.rref_local = impl->id().local;
    data.fork_worker = fork.worker;
    data.fork_local = fork.local;
    data.parent = self_.id;
    // An object's class has no wire form (the codec moves data, not
    // classes): its users see the type Any, as for a remote() result.
    data.type = impl->type()->kind() == c10::TypeKind::ClassType
                    ? c10::AnyType::get()
                    : impl->type();
    absl::MutexLock lock(&mu_);
    if (impl->isOwner()) {
      // The receiver is a confirmed user from the moment it arrives.
      owners_.emplace(impl->id(), c10::intrusive_ptr<OwnerRRef>::reclaim_copy(
                                      static_cast<OwnerRRef*>(impl)));
      forks_[impl->id()].insert(fork);
    } else {
      // Kept until the owner has confirmed the child.
      pending_children_.emplace(
          fork, c10::intrusive_ptr<RRefImpl>::reclaim_copy(impl));
    }
    return data;
  }

  absl::StatusOr<c10::intrusive_ptr<c10::RRefInterface>> adopt(
      const wire::RRefForkData& data) override {
    const RRefId id{data.rref_worker, data.rref_local};
    const ForkId fork{data.fork_worker, data.fork_local};
    absl::StatusOr<WorkerInfo> owner = worker_info(data.owner);
    if (!owner.ok()) return owner.status();
    absl::StatusOr<WorkerInfo> parent = worker_info(data.parent);
    if (!parent.ok()) return parent.status();
    if (data.owner == self_.id) {
      c10::intrusive_ptr<OwnerRRef> local = get_or_create_owner(id, data.type);
      if (data.parent == self_.id) {
        // Sent to ourselves: the fork our fork() registered is not a user.
        delete_fork(id, fork);
      } else {
        // Back from a user: that user may let go of its child.
        send_control(*parent, MessageType::kRRefChildAccept,
                     ids({fork.worker, fork.local}));
      }
      return c10::intrusive_ptr<c10::RRefInterface>(local);
    }
    auto user = c10::make_intrusive<UserRRef>(shared_from_this(), *owner, id,
                                              fork, data.type);
    if (data.parent == data.owner) {
      user->confirm(absl::OkStatus());
      return c10::intrusive_ptr<c10::RRefInterface>(user);
    }
    {
      absl::MutexLock lock(&mu_);
      pending_users_.emplace(fork, user);
    }
    std::weak_ptr<ContextState> weak = weak_from_this();
    WorkerInfo parent_info = *parent;
    send_control(*owner, MessageType::kRRefForkRequest,
                 ids({id.worker, id.local, fork.worker, fork.local}),
                 [weak, fork, parent_info](absl::Status status) {
                   auto self = weak.lock();
                   if (self == nullptr) return;
                   self->finish_pending_user(fork, status);
                   if (status.ok()) {
                     self->send_control(parent_info,
                                        MessageType::kRRefChildAccept,
                                        ids({fork.worker, fork.local}));
                   }
                 });
    return c10::intrusive_ptr<c10::RRefInterface>(user);
  }

  void add_pending_user(const c10::intrusive_ptr<UserRRef>& user) {
    absl::MutexLock lock(&mu_);
    pending_users_.emplace(user->fork_id(), user);
  }

  // Confirms (or fails) a pending user and stops holding it.
  void finish_pending_user(const ForkId& fork, absl::Status status) {
    c10::intrusive_ptr<UserRRef> user;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_users_.find(fork);
      if (it == pending_users_.end()) return;
      user = std::move(it->second);
      pending_users_.erase(it);
    }
    user->confirm(std::move(status));
  }

  void user_created(const RRefId& id, const ForkId& fork,
                    const WorkerInfo& owner) {
    absl::MutexLock lock(&mu_);
    live_users_.emplace(fork, LiveUser{id, owner});
  }

  void user_deleted(const RRefId& id, const ForkId& fork,
                    const WorkerInfo& owner) {
    {
      absl::MutexLock lock(&mu_);
      // Released at shutdown: the owner was told already.
      if (live_users_.erase(fork) == 0) return;
    }
    send_control(owner, MessageType::kRRefUserDelete,
                 ids({id.worker, id.local, fork.worker, fork.local}));
  }

  // Graceful shutdown: tells the owners of every user reference still held
  // here that it is gone; later use of those references fails cleanly.
  //
  // Users that a value owned here holds (a remote() whose function returned
  // RRefs) stay: a peer may still fetch that value and fork them, and the
  // owner must not let go of theirs meanwhile. They are released when that
  // value goes, as any user.
  void release_all_users() {
    absl::flat_hash_map<ForkId, LiveUser> released;
    // Outside the lock: dropping these references may run destructors.
    std::vector<c10::intrusive_ptr<c10::RRefInterface>> held;
    {
      absl::MutexLock lock(&mu_);
      released.swap(live_users_);
      for (const auto& [id, owner] : owners_) {
        Future<c10::IValue> value = owner->value();
        if (value.is_ready() && value.result().ok()) {
          collect_rrefs(*value.result(), held);
        }
      }
      for (const auto& rref : held) {
        const auto* user = dynamic_cast<const UserRRef*>(rref.get());
        if (user == nullptr) continue;
        auto it = released.find(user->fork_id());
        if (it == released.end()) continue;
        live_users_.insert(*it);
        released.erase(it);
      }
    }
    for (const auto& [fork, user] : released) {
      send_control(user.owner, MessageType::kRRefUserDelete,
                   ids({user.id.worker, user.id.local, fork.worker,
                        fork.local}));
    }
  }

  // After the drain: RRefs owned here that still have users.
  absl::Status leak_report() {
    absl::MutexLock lock(&mu_);
    if (forks_.empty()) return absl::OkStatus();
    std::vector<std::string> leaks;
    for (const auto& [id, forks] : forks_) {
      std::vector<std::string> users;
      for (const ForkId& fork : forks) users.push_back(fork.str());
      leaks.push_back(absl::StrCat("RRef ", id.str(), " (users ",
                                   absl::StrJoin(users, ", "), ")"));
    }
    std::sort(leaks.begin(), leaks.end());
    return absl::FailedPreconditionError(absl::StrCat(
        "leaked RRefs owned by worker '", self_.name,
        "' still have users after shutdown: ", absl::StrJoin(leaks, "; ")));
  }

  // ---- handlers (on the worker pool)

  // A call target: a function's name, or (RRef owned here, method name).
  static absl::Status check_target(const c10::IValue& target) {
    if (target.isString()) return absl::OkStatus();
    if (target.isTuple() && target.toTupleRef().elements().size() == 2 &&
        target.toTupleRef().elements()[0].isRRef() &&
        target.toTupleRef().elements()[1].isString()) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        "malformed call target: expected a name or (RRef, method)");
  }

  static std::string describe_target(const c10::IValue& target) {
    if (target.isString()) return absl::StrCat("'", target.toStringRef(), "'");
    return absl::StrCat("method '",
                        target.toTupleRef().elements()[1].toStringRef(),
                        "' of an RRef");
  }

  absl::StatusOr<c10::IValue> invoke(const c10::IValue& target,
                                     std::vector<c10::IValue> args,
                                     const Kwargs& kwargs) {
    absl::StatusOr<c10::IValue> result =
        absl::CancelledError("the worker shut down before the call ran");
    if (target.isString()) {
      with_worker([&](Worker& worker) {
        result = worker.callables().call(target.toStringRef(), std::move(args),
                                         kwargs);
      });
      return result;
    }
    const auto& parts = target.toTupleRef().elements();
    auto* owner = dynamic_cast<OwnerRRef*>(parts[0].toRRef().get());
    if (owner == nullptr) {
      return absl::InvalidArgumentError(
          "a method call must run on the owner of the RRef");
    }
    absl::StatusOr<c10::IValue> self =
        owner->value().get(absl::Now() + absl::Seconds(60));
    if (!self.ok()) return self.status();
    return Callables::call_method(*self, parts[1].toStringRef(),
                                  std::move(args), kwargs);
  }

  static Kwargs kwargs_of(const c10::IValue& dict) {
    Kwargs kwargs;
    for (const auto& entry : dict.toGenericDict()) {
      if (entry.key().isString()) {
        kwargs.emplace(entry.key().toStringRef(), entry.value());
      }
    }
    return kwargs;
  }

  // Runs a decoded (target, args, kwargs, ...) call once its RRef arguments
  // are confirmed; errors name this worker and the target.
  absl::StatusOr<c10::IValue> run_call(const c10::IValue& call) {
    const auto& parts = call.toTupleRef().elements();
    absl::Status ready = gate(call);
    absl::StatusOr<c10::IValue> result =
        ready.ok() ? invoke(parts[0], parts[1].toTupleRef().elements().vec(),
                            kwargs_of(parts[2]))
                   : absl::StatusOr<c10::IValue>(ready);
    if (!result.ok()) {
      result = absl::Status(
          result.status().code(),
          absl::StrCat("Error on worker ", self_.id, " (", self_.name,
                       ") calling ", describe_target(parts[0]), ": ",
                       result.status().message()));
    }
    return result;
  }

  static absl::Status check_call(const c10::IValue& call, size_t size,
                                 absl::string_view what) {
    if (!call.isTuple() || call.toTupleRef().elements().size() != size) {
      return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
    }
    const auto& parts = call.toTupleRef().elements();
    if (!parts[1].isTuple() || !parts[2].isGenericDict()) {
      return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
    }
    for (size_t i = 3; i < size; ++i) {
      if (!parts[i].isInt()) {
        return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
      }
    }
    return check_target(parts[0]);
  }

  Future<Message> on_remote_call(Message request) {
    wire::AutogradMeta autograd;
    absl::StatusOr<c10::IValue> call = decode_with_hook(request, &autograd);
    if (!call.ok()) return Future<Message>::ready(call.status());
    if (absl::Status ok = check_call(*call, 7, "REMOTE_CALL"); !ok.ok()) {
      return Future<Message>::ready(ok);
    }
    const auto& parts = call->toTupleRef().elements();
    const RRefId id{static_cast<int32_t>(parts[3].toInt()), parts[4].toInt()};
    const ForkId fork{static_cast<int32_t>(parts[5].toInt()), parts[6].toInt()};
    c10::intrusive_ptr<OwnerRRef> owner =
        get_or_create_owner(id, c10::AnyType::get());
    if (fork.worker >= 0) add_fork(id, fork);
    // A function that answers later (core/ivalue_future.h) gives the RRef
    // its value when it does; no pool thread waits meanwhile.
    std::weak_ptr<ContextState> weak = weak_from_this();
    return settle_call(*call, run_call_serving(*call, autograd))
        .then([weak, owner, id, fork](const absl::StatusOr<c10::IValue>& value)
                  -> absl::StatusOr<Message> {
          // Every later use of the RRef (fetch, method call) reports a
          // failure.
          absl::StatusOr<c10::IValue> result = value;
          if (!result.ok()) result = creation_failure(result.status());
          owner->set_value(result);
          // A remote() to this worker itself: its caller holds the
          // OwnerRRef, so the table only keeps it while it has forks.
          if (fork.worker < 0) {
            if (auto self = weak.lock()) self->release_if_unforked(id);
          }
          if (!result.ok()) return result.status();
          return ack();
        });
  }

  // A call's result as a Future (a function that answers later completes
  // it then); a later error names this worker and the target as
  // run_call's do.
  Future<c10::IValue> settle_call(const c10::IValue& call,
                                  absl::StatusOr<c10::IValue> result) {
    if (!result.ok() || !result->isFuture()) {
      return Future<c10::IValue>::ready(std::move(result));
    }
    std::string prefix = absl::StrCat(
        "Error on worker ", self_.id, " (", self_.name, ") calling ",
        describe_target(call.toTupleRef().elements()[0]), ": ");
    return settle(*std::move(result))
        .then([prefix](const absl::StatusOr<c10::IValue>& value)
                  -> absl::StatusOr<c10::IValue> {
          if (value.ok()) return value;
          return absl::Status(value.status().code(),
                              absl::StrCat(prefix, value.status().message()));
        });
  }

  Future<Message> on_method_call(Message request) {
    wire::AutogradMeta autograd;
    absl::StatusOr<c10::IValue> call = decode_with_hook(request, &autograd);
    if (!call.ok()) return Future<Message>::ready(call.status());
    if (absl::Status ok = check_call(*call, 3, "RREF_METHOD_CALL"); !ok.ok()) {
      return Future<Message>::ready(ok);
    }
    std::weak_ptr<ContextState> weak = weak_from_this();
    return settle_call(*call, run_call_serving(*call, autograd))
        .then([weak, autograd](const absl::StatusOr<c10::IValue>& result)
                  -> absl::StatusOr<Message> {
          if (!result.ok()) return result.status();
          auto self = weak.lock();
          if (self == nullptr) {
            return absl::CancelledError("the worker is shut down");
          }
          Message response;
          response.type = MessageType::kCallRet;
          absl::Status encoded =
              self->encode_response(*result, autograd, response);
          if (!encoded.ok()) return encoded;
          return response;
        });
  }

  // (rref_worker, rref_local, wait_ms): the value, once there. The owner
  // waits at most wait_ms (the fetcher's own timeout) for a value that is
  // not there yet; if its REMOTE_CALL never arrived by then, the RRef is
  // failed and let go, so nothing waits or leaks forever.
  Future<Message> on_fetch(Message request) {
    wire::AutogradMeta autograd;
    absl::StatusOr<c10::IValue> payload = decode_with_hook(request, &autograd);
    if (!payload.ok()) return Future<Message>::ready(payload.status());
    absl::StatusOr<std::vector<int64_t>> v = ints_of(*payload, 3, "RREF_FETCH");
    if (!v.ok()) return Future<Message>::ready(v.status());
    const RRefId id{static_cast<int32_t>((*v)[0]), (*v)[1]};
    const absl::Duration wait =
        std::min(absl::Milliseconds(std::max<int64_t>((*v)[2], 0)),
                 kMaxValueWait);
    c10::intrusive_ptr<OwnerRRef> owner =
        get_or_create_owner(id, c10::AnyType::get());
    std::weak_ptr<ContextState> weak = weak_from_this();
    Promise<Message> reply;
    owner->value().on_complete(
        [weak, reply, autograd](const absl::StatusOr<c10::IValue>& value) {
          if (!value.ok()) {
            reply.set(value.status());
            return;
          }
          auto self = weak.lock();
          if (self == nullptr) {
            reply.set(absl::CancelledError("worker is gone"));
            return;
          }
          Message response;
          response.type = MessageType::kCallRet;
          absl::Status encoded =
              self->encode_response(*value, autograd, response);
          if (!encoded.ok()) {
            reply.set(encoded);
          } else {
            reply.set(std::move(response));
          }
        });
    if (!reply.is_set()) {
      // Holds the id, not the owner: a value that comes meanwhile is let go
      // with the last user, not when this fetch could have timed out. The
      // timer itself is cancelled once the value is there.
      const internal::TimerQueue::Id timer =
          timers_.schedule(absl::Now() + wait, [weak, id, wait] {
            if (auto self = weak.lock()) self->fail_valueless(id, wait);
          });
      owner->value().on_complete(
          [weak, timer](const absl::StatusOr<c10::IValue>&) {
            if (auto self = weak.lock()) self->timers_.cancel(timer);
          });
    }
    return reply.future();
  }

  // A fetch waited `wait` for RRef `id`'s value: if its REMOTE_CALL never
  // came, the RRef fails and, without users, is let go.
  void fail_valueless(const RRefId& id, absl::Duration wait) {
    c10::intrusive_ptr<OwnerRRef> owner;
    {
      absl::MutexLock lock(&mu_);
      auto it = owners_.find(id);
      if (it != owners_.end()) owner = it->second;
    }
    // Kept in owners_ until it has a value (delete_fork): still there.
    if (owner == nullptr || owner->value().is_ready()) return;
    owner->set_value(creation_failure(absl::DeadlineExceededError(
        absl::StrCat("RRef ", id.str(), " has no value after ",
                     absl::FormatDuration(wait),
                     " (its REMOTE_CALL never arrived)"))));
    release_if_unforked(id);
  }

  Future<Message> on_user_delete(Message request) {
    absl::StatusOr<std::vector<int64_t>> v = control_ints(request, 4);
    if (!v.ok()) return Future<Message>::ready(v.status());
    delete_fork({static_cast<int32_t>((*v)[0]), (*v)[1]},
                {static_cast<int32_t>((*v)[2]), (*v)[3]});
    return Future<Message>::ready(ack());
  }

  Future<Message> on_fork_request(Message request) {
    absl::StatusOr<std::vector<int64_t>> v = control_ints(request, 4);
    if (!v.ok()) return Future<Message>::ready(v.status());
    const RRefId id{static_cast<int32_t>((*v)[0]), (*v)[1]};
    get_or_create_owner(id, c10::AnyType::get());
    add_fork(id, {static_cast<int32_t>((*v)[2]), (*v)[3]});
    return Future<Message>::ready(ack());
  }

  Future<Message> on_child_accept(Message request) {
    absl::StatusOr<std::vector<int64_t>> v = control_ints(request, 2);
    if (!v.ok()) return Future<Message>::ready(v.status());
    c10::intrusive_ptr<RRefImpl> released;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_children_.find(
          ForkId{static_cast<int32_t>((*v)[0]), (*v)[1]});
      if (it != pending_children_.end()) {
        released = std::move(it->second);
        pending_children_.erase(it);
      }
    }
    return Future<Message>::ready(ack());
  }

  // Waits until every RRef among a call's arguments is confirmed.
  absl::Status gate(const c10::IValue& call) {
    std::vector<c10::intrusive_ptr<c10::RRefInterface>> rrefs;
    collect_rrefs(call, rrefs);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (const auto& rref : rrefs) {
      auto* user = dynamic_cast<UserRRef*>(rref.get());
      if (user == nullptr) continue;
      absl::StatusOr<bool> confirmed = user->confirmation().get(deadline);
      if (!confirmed.ok()) {
        return absl::Status(
            confirmed.status().code(),
            absl::StrCat("an RRef argument was not confirmed by its owner: ",
                         confirmed.status().message()));
      }
    }
    return absl::OkStatus();
  }

  // Decodes through the worker: RRefs with this hook, and a message in a
  // distributed autograd context through the autograd hook.
  absl::StatusOr<c10::IValue> decode_with_hook(
      const Message& message, wire::AutogradMeta* autograd = nullptr) {
    absl::StatusOr<c10::IValue> value =
        absl::CancelledError("the worker is shut down");
    with_worker([&](Worker& w) { value = w.decode(message, autograd); });
    return value;
  }

  // The response to a request that came with `request` autograd metadata.
  absl::Status encode_response(const c10::IValue& value,
                               const wire::AutogradMeta& request,
                               Message& out) {
    absl::Status encoded = absl::CancelledError("the worker is shut down");
    with_worker(
        [&](Worker& w) { encoded = w.encode_response(value, request, out); });
    return encoded;
  }

  // run_call in the autograd context the request came with.
  absl::StatusOr<c10::IValue> run_call_serving(
      const c10::IValue& call, const wire::AutogradMeta& autograd) {
    absl::StatusOr<c10::IValue> result =
        absl::CancelledError("the worker shut down before the call ran");
    with_worker([&](Worker& w) {
      Worker::ServingContext serving(w, autograd);
      result = run_call(call);
    });
    return result;
  }

  RRefDebugInfo debug_info() {
    absl::MutexLock lock(&mu_);
    RRefDebugInfo info;
    info.owners = static_cast<int64_t>(owners_.size());
    for (const auto& [id, forks] : forks_) info.forks += forks.size();
    info.pending_users = static_cast<int64_t>(pending_users_.size());
    info.pending_children = static_cast<int64_t>(pending_children_.size());
    return info;
  }

  // After close(): lets go of the references it held, outside the lock.
  void drop_closed_users() {
    std::vector<c10::intrusive_ptr<RRefImpl>> dropped;
    absl::MutexLock lock(&mu_);
    dropped.swap(dropped_);
  }

 private:
  absl::StatusOr<std::vector<int64_t>> control_ints(const Message& request,
                                                    size_t n) {
    absl::StatusOr<c10::IValue> payload = wire::decode(request);
    if (!payload.ok()) return payload.status();
    return ints_of(*payload, n, message_type_name(request.type));
  }

  absl::Mutex mu_;
  Worker* worker_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
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
  internal::TimerQueue timers_;
};

namespace {

class RRefExtension final : public WorkerExtension {
 public:
  RRefExtension(Worker& worker, RRefOptions options)
      : options_(options), state_(std::make_shared<ContextState>(worker)) {}

  absl::Status before_graceful_join() override {
    state_->release_all_users();
    return absl::OkStatus();
  }

  absl::Status after_graceful_join() override {
    return options_.leak_check ? state_->leak_report() : absl::OkStatus();
  }
  ~RRefExtension() override {
    state_->close();
    state_->drop_closed_users();
  }

  const std::shared_ptr<ContextState>& state() const { return state_; }

 private:
  const RRefOptions options_;
  std::shared_ptr<ContextState> state_;
};

}  // namespace

RRefImpl::RRefImpl(std::shared_ptr<ContextState> context, WorkerInfo owner,
                   RRefId id, c10::TypePtr type)
    : context_(std::move(context)),
      owner_(std::move(owner)),
      id_(id),
      type_(std::move(type)) {}

UserRRef::UserRRef(std::shared_ptr<ContextState> context, WorkerInfo owner,
                   RRefId id, ForkId fork_id, c10::TypePtr type)
    : RRefImpl(std::move(context), std::move(owner), id, std::move(type)),
      fork_id_(fork_id) {
  this->context()->user_created(this->id(), fork_id_, owner_info());
}

UserRRef::~UserRRef() { context()->user_deleted(id(), fork_id_, owner_info()); }

void UserRRef::confirm(absl::Status status) const {
  if (status.ok()) {
    confirmed_.set(true);
  } else {
    confirmed_.set(status);
  }
}

absl::StatusOr<std::shared_ptr<ContextState>> context_of(Worker* worker) {
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        "no RPC worker: call tether::init_rpc() first");
  }
  auto* extension = worker->extension<RRefExtension>();
  if (extension == nullptr) {
    return absl::FailedPreconditionError(
        "this worker does not serve RRefs: build it with rref_extension()");
  }
  return extension->state();
}

absl::StatusOr<std::shared_ptr<ContextState>> current_context() {
  return context_of(current_worker());
}

}  // namespace rref

using rref::ContextState;
using rref::OwnerRRef;
using rref::RRefImpl;
using rref::UserRRef;

RRef::RRef(c10::intrusive_ptr<c10::RRefInterface> impl)
    : impl_(std::move(impl)) {}

rref::RRefImpl* RRef::impl() const {
  return static_cast<rref::RRefImpl*>(impl_.get());
}

absl::StatusOr<RRef> RRef::local(c10::IValue value) {
  Worker* worker = current_worker();
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        "no RPC worker: call tether::init_rpc() first");
  }
  return local(*worker, std::move(value));
}

absl::StatusOr<RRef> RRef::local(Worker& worker, c10::IValue value) {
  absl::StatusOr<std::shared_ptr<ContextState>> context =
      rref::context_of(&worker);
  if (!context.ok()) return context.status();
  // A Python object kept here (tether.rpc.RRef(obj)) has a type the wire
  // cannot name; its users see Any, as with remote()'s results.
  c10::TypePtr type =
      value.isPyObject() ? c10::AnyType::get() : value.type();
  auto owner = c10::make_intrusive<OwnerRRef>(
      *context, (*context)->self(), (*context)->new_id(), std::move(type));
  owner->set_value(std::move(value));
  return RRef(c10::intrusive_ptr<c10::RRefInterface>(owner));
}

absl::StatusOr<RRef> RRef::from_ivalue(const c10::IValue& v) {
  if (!v.isRRef()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an RRef, got a ", v.tagKind()));
  }
  c10::intrusive_ptr<c10::RRefInterface> impl = v.toRRef();
  if (dynamic_cast<RRefImpl*>(impl.get()) == nullptr) {
    return absl::InvalidArgumentError("not a tether RRef");
  }
  return RRef(std::move(impl));
}

c10::IValue RRef::to_ivalue() const {
  return c10::IValue(impl_);
}

WorkerInfo RRef::owner() const { return impl()->owner_info(); }
std::string RRef::owner_name() const { return impl()->owner_info().name; }
bool RRef::is_owner() const { return impl_->isOwner(); }
bool RRef::confirmed_by_owner() const { return impl_->confirmedByOwner(); }

std::pair<int32_t, int64_t> RRef::id() const {
  const rref::RRefId& id = impl()->id();
  return {id.worker, id.local};
}

std::pair<int32_t, int64_t> RRef::fork_id() const {
  const auto* user = dynamic_cast<const rref::UserRRef*>(impl_.get());
  if (user == nullptr) return {-1, -1};
  return {user->fork_id().worker, user->fork_id().local};
}

Future<c10::IValue> rref::rpc_async_to_owner(const RRef& rref,
                                             absl::string_view fn,
                                             std::vector<c10::IValue> args,
                                             absl::Duration timeout) {
  Future<c10::IValue> result = Future<c10::IValue>::ready(
      absl::FailedPreconditionError("the RRef's worker is shut down"));
  rref.impl()->context()->with_worker([&](Worker& worker) {
    result = worker.rpc_async(rref.owner(), fn, std::move(args), {}, timeout);
  });
  return result;
}

Future<bool> RRef::get_future() const {
  auto failed = [](const absl::Status& status) -> absl::StatusOr<bool> {
    return rref::creation_failure(status);
  };
  if (auto* owner = dynamic_cast<OwnerRRef*>(impl_.get())) {
    return owner->value().then(
        [failed](const absl::StatusOr<c10::IValue>& value)
            -> absl::StatusOr<bool> {
          if (!value.ok()) return failed(value.status());
          return true;
        });
  }
  return static_cast<UserRRef*>(impl_.get())
      ->confirmation()
      .then([failed](const absl::StatusOr<bool>& confirmed)
                -> absl::StatusOr<bool> {
        if (!confirmed.ok()) return failed(confirmed.status());
        return true;
      });
}

absl::StatusOr<c10::IValue> RRef::local_value() const {
  auto* owner = dynamic_cast<OwnerRRef*>(impl_.get());
  if (owner == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "local_value() on a user of RRef ", impl()->id().str(),
        "; only its owner '", impl()->owner_info().name,
        "' holds the value (use to_here())"));
  }
  return owner->value().get(absl::Now() + absl::Seconds(60));
}

absl::StatusOr<c10::IValue> RRef::to_here(absl::Duration timeout) const {
  if (auto* owner = dynamic_cast<OwnerRRef*>(impl_.get())) {
    absl::Duration bound =
        timeout == kDefaultTimeout ? absl::Seconds(60) : timeout;
    return owner->value().get(bound <= absl::ZeroDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + bound);
  }
  auto* user = static_cast<UserRRef*>(impl_.get());
  Future<bool> confirmation = user->confirmation();
  if (confirmation.is_ready() && !confirmation.result().ok()) {
    return rref::creation_failure(confirmation.result().status());
  }
  const std::shared_ptr<ContextState>& context = impl()->context();
  Message request;
  request.type = MessageType::kRRefFetch;
  Future<Message> response;
  bool alive = context->with_worker([&](Worker& worker) {
    const absl::Duration bound = worker.resolve_timeout(timeout);
    const int64_t wait_ms = bound == absl::InfiniteDuration()
                                ? absl::ToInt64Milliseconds(rref::kMaxValueWait)
                                : absl::ToInt64Milliseconds(bound);
    absl::Status encoded = worker.encode_request(
        c10::ivalue::Tuple::create({c10::IValue(int64_t{impl()->id().worker}),
                                    c10::IValue(impl()->id().local),
                                    c10::IValue(wait_ms)}),
        impl()->owner_info(), request);
    if (!encoded.ok()) {
      response = Future<Message>::ready(encoded);
      return;
    }
    response = worker.send(impl()->owner_info(), std::move(request), bound);
  });
  if (!alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        "to_here() on RRef ", impl()->id().str(), " after its worker shut down"));
  }
  absl::StatusOr<Message> fetched = response.get();
  if (!fetched.ok()) {
    if (absl::StrContains(fetched.status().message(), rref::kCreationFailed)) {
      return fetched.status();  // the owner's own report
    }
    // The remote() may have failed while the fetch waited.
    if (confirmation.is_ready() && !confirmation.result().ok()) {
      return rref::creation_failure(confirmation.result().status());
    }
    return absl::Status(fetched.status().code(),
                        absl::StrCat("to_here() of RRef ", impl()->id().str(),
                                     " from '", impl()->owner_info().name,
                                     "': ", fetched.status().message()));
  }
  return context->decode_with_hook(*fetched);
}

absl::StatusOr<RRef> remote(const To& to, absl::string_view fn,
                            std::vector<c10::IValue> args, Kwargs kwargs,
                            absl::Duration timeout) {
  Worker* worker = current_worker();
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        "no RPC worker: call tether::init_rpc() first");
  }
  return remote(*worker, to, fn, std::move(args), std::move(kwargs), timeout);
}

namespace {

// remote() of a function (`target` a name) or of a method of the object an
// RRef holds (`target` the tuple (RRef, method)).
absl::StatusOr<RRef> remote_call(Worker& caller, const To& to,
                                 c10::IValue call_target,
                                 absl::string_view what,
                                 std::vector<c10::IValue> args, Kwargs kwargs,
                                 absl::Duration timeout) {
  absl::StatusOr<std::shared_ptr<ContextState>> context =
      rref::context_of(&caller);
  if (!context.ok()) return context.status();
  const std::string fn(what);
  ContextState& state = **context;
  absl::StatusOr<RRef> made = absl::FailedPreconditionError(
      "the worker is shut down");
  state.with_worker([&](Worker& worker) {
    absl::StatusOr<WorkerInfo> target = worker.get_worker_info(to);
    if (!target.ok()) {
      made = target.status();
      return;
    }
    const rref::RRefId id = state.new_id();
    c10::intrusive_ptr<RRefImpl> handle;
    c10::intrusive_ptr<UserRRef> user;
    rref::ForkId fork{-1, -1};
    if (target->id == state.self().id) {
      handle = state.get_or_create_owner(id, c10::AnyType::get());
    } else {
      fork = state.new_id();
      user = c10::make_intrusive<UserRRef>(*context, *target, id, fork,
                                           c10::AnyType::get());
      handle = user;
    }
    c10::impl::GenericDict kwargs_dict(c10::StringType::get(),
                                       c10::AnyType::get());
    for (auto& [key, value] : kwargs) kwargs_dict.insert(key, std::move(value));
    c10::IValue call = c10::ivalue::Tuple::create(
        {std::move(call_target), c10::ivalue::Tuple::create(std::move(args)),
         c10::IValue(std::move(kwargs_dict)), c10::IValue(int64_t{id.worker}),
         c10::IValue(id.local), c10::IValue(int64_t{fork.worker}),
         c10::IValue(fork.local)});
    Message request;
    request.type = MessageType::kRemoteCall;
    absl::Status encoded = worker.encode_request(call, *target, request);
    if (!encoded.ok()) {
      made = absl::Status(
          encoded.code(),
          absl::StrCat("cannot send arguments of '", fn, "' to worker '",
                       target->name, "': ", encoded.message()));
      return;
    }
    if (user != nullptr) state.add_pending_user(user);
    std::weak_ptr<ContextState> weak = *context;
    const rref::ForkId user_fork = fork;
    const bool to_self = user == nullptr;
    c10::intrusive_ptr<RRefImpl> keep = handle;
    worker.send(*target, std::move(request), timeout)
        .on_complete([weak, user_fork, to_self,
                      keep](const absl::StatusOr<Message>& response) {
          auto self = weak.lock();
          if (self == nullptr) return;
          absl::Status status = response.status();
          if (to_self) {
            // The handler set the owner's value; a lost message did not.
            if (!status.ok()) {
              static_cast<OwnerRRef*>(keep.get())->set_value(status);
            }
            return;
          }
          self->finish_pending_user(user_fork, status);
        });
    made = RRef(c10::intrusive_ptr<c10::RRefInterface>(handle));
  });
  return made;
}

// The message of a method call on `rref`'s object.
absl::StatusOr<Message> method_call_message(Worker& worker, const RRef& rref,
                                            absl::string_view method,
                                            std::vector<c10::IValue> args,
                                            Kwargs kwargs) {
  c10::impl::GenericDict kwargs_dict(c10::StringType::get(),
                                     c10::AnyType::get());
  for (auto& [key, value] : kwargs) kwargs_dict.insert(key, std::move(value));
  c10::IValue call = c10::ivalue::Tuple::create(
      {c10::ivalue::Tuple::create(
           {rref.to_ivalue(), c10::IValue(std::string(method))}),
       c10::ivalue::Tuple::create(std::move(args)),
       c10::IValue(std::move(kwargs_dict))});
  Message request;
  request.type = MessageType::kRRefMethodCall;
  absl::Status encoded = worker.encode_request(call, rref.owner(), request);
  if (!encoded.ok()) {
    return absl::Status(encoded.code(),
                        absl::StrCat("cannot send arguments of method '",
                                     method, "': ", encoded.message()));
  }
  return request;
}

}  // namespace

absl::StatusOr<RRef> remote(Worker& caller, const To& to, absl::string_view fn,
                            std::vector<c10::IValue> args, Kwargs kwargs,
                            absl::Duration timeout) {
  return remote_call(caller, to, c10::IValue(std::string(fn)), fn,
                     std::move(args), std::move(kwargs), timeout);
}

Future<c10::IValue> AsyncProxy::call(absl::string_view method,
                                     std::vector<c10::IValue> args,
                                     Kwargs kwargs) const {
  const std::shared_ptr<ContextState> context = rref_.impl()->context();
  Future<c10::IValue> result = Future<c10::IValue>::ready(
      absl::FailedPreconditionError("the RRef's worker is shut down"));
  const WorkerInfo owner = rref_.owner();
  const absl::Duration timeout = timeout_;
  context->with_worker([&](Worker& worker) {
    absl::StatusOr<Message> request =
        method_call_message(worker, rref_, method, std::move(args),
                            std::move(kwargs));
    if (!request.ok()) {
      result = Future<c10::IValue>::ready(request.status());
      return;
    }
    std::weak_ptr<ContextState> weak = context;
    result = worker.send(owner, *std::move(request), timeout)
                 .then([weak](const absl::StatusOr<Message>& response)
                           -> absl::StatusOr<c10::IValue> {
                   if (!response.ok()) return response.status();
                   auto self = weak.lock();
                   if (self == nullptr) {
                     return absl::CancelledError("the worker is shut down");
                   }
                   return self->decode_with_hook(*response);
                 });
  });
  return result;
}

absl::StatusOr<c10::IValue> SyncProxy::call(absl::string_view method,
                                            std::vector<c10::IValue> args,
                                            Kwargs kwargs) const {
  return AsyncProxy(rref_, timeout_)
      .call(method, std::move(args), std::move(kwargs))
      .get();
}

absl::StatusOr<RRef> RemoteProxy::call(absl::string_view method,
                                       std::vector<c10::IValue> args,
                                       Kwargs kwargs) const {
  absl::StatusOr<RRef> result =
      absl::FailedPreconditionError("the RRef's worker is shut down");
  const std::shared_ptr<ContextState> context = rref_.impl()->context();
  context->with_worker([&](Worker& worker) {
    result = remote_call(
        worker, rref_.owner(),
        c10::ivalue::Tuple::create(
            {rref_.to_ivalue(), c10::IValue(std::string(method))}),
        absl::StrCat("method '", method, "'"), std::move(args),
        std::move(kwargs), timeout_);
  });
  return result;
}

namespace {

// Backward from the value an RRef holds, on its owner (`worker`).
absl::Status owner_backward(Worker& worker, const RRef& rref,
                            int64_t context_id, bool retain_graph) {
  absl::StatusOr<c10::IValue> value = rref.local_value();
  if (!value.ok()) return value.status();
  if (!value->isTensor()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward of RRef ", rref.impl()->id().str(),
        ": its value is a ", value->tagKind(), ", not a scalar tensor"));
  }
  return autograd::backward(worker, context_id, {value->toTensor()},
                            retain_graph);
}

// tether::rref_backward(Any rref, int context_id, bool retain_graph): the
// owner's side of RRef::backward.
void rref_backward_op(const c10::IValue& rref, int64_t context_id,
                      bool retain_graph) {
  absl::StatusOr<RRef> r = RRef::from_ivalue(rref);
  TORCH_CHECK(r.ok(), r.status().ToString());
  Worker* worker = Worker::serving();
  TORCH_CHECK(worker != nullptr, "rref_backward must run as an RPC");
  absl::Status done = owner_backward(*worker, *r, context_id, retain_graph);
  TORCH_CHECK(done.ok(), done.ToString());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tether, m) {
  m.def("rref_backward(Any rref, int context_id, bool retain_graph) -> ()",
        &rref_backward_op);
}

absl::Status RRef::backward(int64_t context_id, bool retain_graph) const {
  absl::Status done = absl::FailedPreconditionError(absl::StrCat(
      "backward() on RRef ", impl()->id().str(), " after its worker shut down"));
  const RRef self = *this;
  impl()->context()->with_worker([&](Worker& worker) {
    if (is_owner()) {
      done = owner_backward(worker, self, context_id, retain_graph);
      return;
    }
    done = worker
               .rpc_sync(owner(), "tether::rref_backward",
                         {to_ivalue(), c10::IValue(context_id),
                          c10::IValue(retain_graph)})
               .status();
  });
  return done;
}

ExtensionFactory rref_extension(RRefOptions options) {
  return [options](
             Worker& worker) -> absl::StatusOr<std::unique_ptr<WorkerExtension>> {
    auto extension = std::make_unique<rref::RRefExtension>(worker, options);
    std::shared_ptr<ContextState> state = extension->state();
    std::weak_ptr<ContextState> weak = state;
    const std::pair<MessageType, Future<Message> (ContextState::*)(Message)>
        handlers[] = {
            {MessageType::kRemoteCall, &ContextState::on_remote_call},
            {MessageType::kRRefFetch, &ContextState::on_fetch},
            {MessageType::kRRefUserDelete, &ContextState::on_user_delete},
            {MessageType::kRRefForkRequest, &ContextState::on_fork_request},
            {MessageType::kRRefChildAccept, &ContextState::on_child_accept},
            {MessageType::kRRefMethodCall, &ContextState::on_method_call},
        };
    for (const auto& [type, method] : handlers) {
      absl::Status added = worker.register_handler(type, route_to(weak, method));
      if (!added.ok()) return added;
    }
    worker.set_rref_hook(state.get());
    worker.set_call_gate([weak](const c10::IValue& call) {
      auto self = weak.lock();
      return self == nullptr ? absl::OkStatus() : self->gate(call);
    });
    return extension;
  };
}

absl::StatusOr<RRefDebugInfo> rref_debug_info(Worker& worker) {
  auto* extension = worker.extension<rref::RRefExtension>();
  if (extension == nullptr) {
    return absl::FailedPreconditionError("this worker does not serve RRefs");
  }
  return extension->state()->debug_info();
}

}  // namespace tether
