// The RRef protocol (rref_impl.h): the per-worker ContextState, the
// extension that owns it, and the owner and user references.
#include "rref/rref_impl.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <utility>

#include "core/ivalue_future.h"
#include "core/rpc.h"
#include "core/wire/capsules.h"

namespace tether {
namespace rref {

std::string GloballyUniqueId::str() const {
  return absl::StrCat(worker, ":", local);
}

absl::Status creation_failure(const absl::Status& status) {
  if (absl::StrContains(status.message(), kCreationFailed)) return status;
  return absl::Status(status.code(),
                      absl::StrCat(kCreationFailed, ": ", status.message()));
}

namespace {

constexpr int kControlAttempts = 6;
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);

bool retryable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

c10::IValue ids(std::initializer_list<int64_t> values) {
  std::vector<c10::IValue> elems;
  for (int64_t v : values) elems.emplace_back(v);
  return c10::ivalue::Tuple::create(std::move(elems));
}

// Whether letting go of `v` runs no Python: tensors, scalars, strings and
// containers of them. Anything else (a Python object, whose destruction
// takes the GIL; a custom or script object; an RRef) may.
bool plain_value(const c10::IValue& v) {
  if (v.isTensor() || v.isNone() || v.isInt() || v.isDouble() || v.isBool() ||
      v.isString() || v.isTensorList() || v.isIntList() || v.isDoubleList() ||
      v.isBoolList()) {
    return true;
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (!plain_value(e)) return false;
    }
    return true;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (!plain_value(e)) return false;
    }
    return true;
  }
  if (v.isGenericDict()) {
    for (const auto& entry : v.toGenericDict()) {
      if (!plain_value(entry.key()) || !plain_value(entry.value())) {
        return false;
      }
    }
    return true;
  }
  return false;
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

// Every RRef inside `v` (lists, tuples, dicts).
void collect_rrefs(const c10::IValue& v,
                   std::vector<c10::intrusive_ptr<c10::RRefInterface>>& out) {
  if (v.isRRef()) {
    out.push_back(v.toRRef());
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements())
      collect_rrefs(e, out);
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

void ContextState::close() {
  worker_.close();
  absl::MutexLock lock(&mu_);
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

absl::StatusOr<WorkerInfo> ContextState::worker_info(int32_t id) {
  absl::StatusOr<WorkerInfo> info =
      absl::FailedPreconditionError("the worker is shut down");
  with_worker(
      [&](Worker& w) { info = w.get_worker_info(static_cast<int>(id)); });
  return info;
}

c10::intrusive_ptr<OwnerRRef> ContextState::get_or_create_owner(
    const RRefId& id, const c10::TypePtr& type) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(id);
  if (it != owners_.end()) return it->second;
  auto owner =
      c10::make_intrusive<OwnerRRef>(shared_from_this(), self_, id, type);
  owners_.emplace(id, owner);
  return owner;
}

void ContextState::add_fork(const RRefId& id, const ForkId& fork) {
  absl::MutexLock lock(&mu_);
  forks_[id].insert(fork);
}

c10::intrusive_ptr<OwnerRRef> ContextState::delete_fork(const RRefId& id,
                                                       const ForkId& fork) {
  c10::intrusive_ptr<OwnerRRef> released;
  absl::MutexLock lock(&mu_);
  auto it = forks_.find(id);
  if (it == forks_.end()) return released;
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
  return released;
}

void ContextState::release_if_unforked(const RRefId& id) {
  c10::intrusive_ptr<OwnerRRef> released;
  absl::MutexLock lock(&mu_);
  if (forks_.contains(id)) return;
  auto it = owners_.find(id);
  if (it == owners_.end()) return;
  released = std::move(it->second);
  owners_.erase(it);
}

void ContextState::send_control(const WorkerInfo& to, MessageType type,
                                c10::IValue payload,
                                std::function<void(absl::Status)> done,
                                int attempt) {
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
                absl::Now() + backoff,
                [weak, to, type, payload, done, attempt] {
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

absl::StatusOr<wire::RRefForkData> ContextState::fork(
    const c10::intrusive_ptr<c10::RRefInterface>& rref) {
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
    pending_children_.emplace(fork,
                              c10::intrusive_ptr<RRefImpl>::reclaim_copy(impl));
  }
  return data;
}

absl::StatusOr<c10::intrusive_ptr<c10::RRefInterface>> ContextState::adopt(
    const wire::RRefForkData& data) {
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
      (void)delete_fork(id, fork);
    } else {
      // Back from a user: that user may let go of its child.
      send_control(*parent, rref::kRRefChildAccept,
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
  send_control(*owner, rref::kRRefForkRequest,
               ids({id.worker, id.local, fork.worker, fork.local}),
               [weak, fork, parent_info](absl::Status status) {
                 auto self = weak.lock();
                 if (self == nullptr) return;
                 self->finish_pending_user(fork, status);
                 if (status.ok()) {
                   self->send_control(parent_info,
                                      rref::kRRefChildAccept,
                                      ids({fork.worker, fork.local}));
                 }
               });
  return c10::intrusive_ptr<c10::RRefInterface>(user);
}

void ContextState::add_pending_user(const c10::intrusive_ptr<UserRRef>& user) {
  absl::MutexLock lock(&mu_);
  pending_users_.emplace(user->fork_id(), user);
}

void ContextState::finish_pending_user(const ForkId& fork,
                                       absl::Status status) {
  c10::intrusive_ptr<UserRRef> user;
  std::optional<std::pair<ForkId, LiveUser>> settled_user;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_users_.find(fork);
    if (it == pending_users_.end()) return;
    user = std::move(it->second);
    pending_users_.erase(it);
    settled_user = take_settled(fork);
  }
  user->confirm(std::move(status));
  if (settled_user) tell_deleted(settled_user->first, settled_user->second);
}

bool ContextState::settled(const ForkId& fork) const {
  if (pending_users_.contains(fork) || users_in_use_.contains(fork)) {
    return false;
  }
  for (const auto& [child, parent] : pending_children_) {
    const auto* user = dynamic_cast<const UserRRef*>(parent.get());
    if (user != nullptr && user->fork_id() == fork) return false;
  }
  return true;
}

std::optional<std::pair<ForkId, ContextState::LiveUser>>
ContextState::take_settled(const ForkId& fork) {
  if (!release_when_settled_.contains(fork) || !settled(fork)) {
    return std::nullopt;
  }
  release_when_settled_.erase(fork);
  auto it = live_users_.find(fork);
  if (it == live_users_.end()) return std::nullopt;
  std::pair<ForkId, LiveUser> user = *it;
  live_users_.erase(it);
  return user;
}

void ContextState::tell_deleted(const ForkId& fork, const LiveUser& user) {
  send_control(user.owner, rref::kRRefUserDelete,
               ids({user.id.worker, user.id.local, fork.worker, fork.local}));
}

void ContextState::user_created(const RRefId& id, const ForkId& fork,
                                const WorkerInfo& owner) {
  absl::MutexLock lock(&mu_);
  live_users_.emplace(fork, LiveUser{id, owner});
}

void ContextState::user_deleted(const RRefId& id, const ForkId& fork,
                                const WorkerInfo& owner) {
  {
    absl::MutexLock lock(&mu_);
    // Released at shutdown: the owner was told already.
    if (live_users_.erase(fork) == 0) return;
  }
  tell_deleted(fork, LiveUser{id, owner});
}

void ContextState::release_all_users() {
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
    for (auto it = released.begin(); it != released.end();) {
      if (settled(it->first)) {
        ++it;
        continue;
      }
      release_when_settled_.insert(it->first);
      live_users_.insert(*it);
      released.erase(it++);
    }
  }
  for (const auto& [fork, user] : released) tell_deleted(fork, user);
}

absl::Status ContextState::leak_report() {
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

absl::Status ContextState::check_target(const c10::IValue& target) {
  if (target.isString()) return absl::OkStatus();
  if (target.isTuple() && target.toTupleRef().elements().size() == 2 &&
      target.toTupleRef().elements()[0].isRRef() &&
      target.toTupleRef().elements()[1].isString()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      "malformed call target: expected a name or (RRef, method)");
}

std::string ContextState::describe_target(const c10::IValue& target) {
  if (target.isString()) return absl::StrCat("'", target.toStringRef(), "'");
  return absl::StrCat("method '",
                      target.toTupleRef().elements()[1].toStringRef(),
                      "' of an RRef");
}

absl::StatusOr<c10::IValue> ContextState::invoke(const c10::IValue& target,
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
  return Callables::call_method(*self, parts[1].toStringRef(), std::move(args),
                                kwargs);
}

absl::StatusOr<c10::IValue> ContextState::run_call(const c10::IValue& call) {
  const auto& parts = call.toTupleRef().elements();
  absl::StatusOr<std::shared_ptr<void>> pass = admit(call);
  absl::StatusOr<Kwargs> kwargs = kwargs_from_wire(parts[2]);
  absl::StatusOr<c10::IValue> result =
      !pass.ok()     ? absl::StatusOr<c10::IValue>(pass.status())
      : !kwargs.ok() ? absl::StatusOr<c10::IValue>(kwargs.status())
                     : invoke(parts[0], parts[1].toTupleRef().elements().vec(),
                              *kwargs);
  if (!result.ok()) {
    result = absl::Status(
        result.status().code(),
        absl::StrCat("Error on worker ", describe(self_), " calling ",
                     describe_target(parts[0]), ": ",
                     result.status().message()));
  }
  return result;
}

absl::Status ContextState::check_call(const c10::IValue& call, size_t size,
                                      absl::string_view what) {
  if (!call.isTuple() || call.toTupleRef().elements().size() != size) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
  }
  const auto& parts = call.toTupleRef().elements();
  if (!parts[1].isTuple() || !is_wire_kwargs(parts[2])) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
  }
  for (size_t i = 3; i < size; ++i) {
    if (!parts[i].isInt()) {
      return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
    }
  }
  return check_target(parts[0]);
}

Future<Message> ContextState::on_pool(
    std::function<Future<Message>(ContextState&)> serve) {
  Future<Message> out =
      Future<Message>::ready(absl::CancelledError("the worker is shut down"));
  std::weak_ptr<ContextState> weak = weak_from_this();
  with_worker([&](Worker& worker) {
    out = worker.serve_on_pool([weak, serve = std::move(serve)] {
      auto self = weak.lock();
      if (self == nullptr) {
        return Future<Message>::ready(
            absl::CancelledError("the worker is shut down"));
      }
      return serve(*self);
    });
  });
  return out;
}

Future<Message> ContextState::on_remote_call(Message request) {
  if (!Worker::decodes_on_arrival(request)) {
    return on_pool([request = std::move(request)](ContextState& self) {
      return self.remote_call(request);
    });
  }
  return remote_call(request);
}

Future<Message> ContextState::remote_call(const Message& request) {
  wire::ContextMeta autograd;
  absl::StatusOr<c10::IValue> call = decode_with_hook(request, &autograd);
  if (!call.ok()) return Future<Message>::ready(call.status());
  if (absl::Status ok = check_call(*call, 7, "REMOTE_CALL"); !ok.ok()) {
    return Future<Message>::ready(ok);
  }
  const c10::IValue& target = call->toTupleRef().elements()[0];
  if (!Worker::runs_on_arrival(target.isString() ? target.toStringRef() : "",
                               autograd) ||
      contains_rref(*call)) {
    return on_pool(
        [call = *std::move(call), autograd](ContextState& self) {
          return self.run_remote_call(call, autograd);
        });
  }
  return run_remote_call(*call, autograd);
}

Future<Message> ContextState::run_remote_call(
    const c10::IValue& call, const wire::ContextMeta& autograd) {
  const auto& parts = call.toTupleRef().elements();
  const RRefId id{static_cast<int32_t>(parts[3].toInt()), parts[4].toInt()};
  const ForkId fork{static_cast<int32_t>(parts[5].toInt()), parts[6].toInt()};
  c10::intrusive_ptr<OwnerRRef> owner =
      get_or_create_owner(id, c10::AnyType::get());
  if (fork.worker >= 0) add_fork(id, fork);
  // A function that answers later (core/ivalue_future.h) gives the RRef
  // its value when it does; no pool thread waits meanwhile.
  std::weak_ptr<ContextState> weak = weak_from_this();
  return settle_call(call, run_call_serving(call, autograd))
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

Future<c10::IValue> ContextState::settle_call(
    const c10::IValue& call, absl::StatusOr<c10::IValue> result) {
  if (!result.ok() || !result->isFuture()) {
    return Future<c10::IValue>::ready(std::move(result));
  }
  std::string prefix =
      absl::StrCat("Error on worker ", describe(self_), " calling ",
                   describe_target(call.toTupleRef().elements()[0]), ": ");
  return settle(*std::move(result))
      .then([prefix](const absl::StatusOr<c10::IValue>& value)
                -> absl::StatusOr<c10::IValue> {
        if (value.ok()) return value;
        return absl::Status(value.status().code(),
                            absl::StrCat(prefix, value.status().message()));
      });
}

Future<Message> ContextState::on_method_call(Message request) {
  wire::ContextMeta autograd;
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

Future<Message> ContextState::on_fetch(Message request) {
  if (!Worker::decodes_on_arrival(request)) {
    return on_pool([request = std::move(request)](ContextState& self) {
      return self.fetch(request);
    });
  }
  return fetch(request);
}

Future<Message> ContextState::fetch(const Message& request) {
  wire::ContextMeta autograd;
  absl::StatusOr<c10::IValue> payload = decode_with_hook(request, &autograd);
  if (!payload.ok()) return Future<Message>::ready(payload.status());
  absl::StatusOr<std::vector<int64_t>> v = ints_of(*payload, 3, "RREF_FETCH");
  if (!v.ok()) return Future<Message>::ready(v.status());
  const RRefId id{static_cast<int32_t>((*v)[0]), (*v)[1]};
  const absl::Duration wait = std::min(
      absl::Milliseconds(std::max<int64_t>((*v)[2], 0)), kMaxValueWait);
  c10::intrusive_ptr<OwnerRRef> owner =
      get_or_create_owner(id, c10::AnyType::get());
  std::weak_ptr<ContextState> weak = weak_from_this();
  Promise<Message> reply;
  owner->value().on_complete([weak, reply, autograd](
                                 const absl::StatusOr<c10::IValue>& value) {
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
    absl::Status encoded = self->encode_response(*value, autograd, response);
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

void ContextState::fail_valueless(const RRefId& id, absl::Duration wait) {
  c10::intrusive_ptr<OwnerRRef> owner;
  {
    absl::MutexLock lock(&mu_);
    auto it = owners_.find(id);
    if (it != owners_.end()) owner = it->second;
  }
  // Kept in owners_ until it has a value (delete_fork): still there.
  if (owner == nullptr || owner->value().is_ready()) return;
  owner->set_value(creation_failure(absl::DeadlineExceededError(absl::StrCat(
      "RRef ", id.str(), " has no value after ", absl::FormatDuration(wait),
      " (its REMOTE_CALL never arrived)"))));
  release_if_unforked(id);
}

Future<Message> ContextState::on_user_delete(Message request) {
  if (!Worker::decodes_on_arrival(request)) {
    return on_pool([request = std::move(request)](ContextState& self) {
      return self.user_delete(request);
    });
  }
  return user_delete(request);
}

Future<Message> ContextState::user_delete(const Message& request) {
  absl::StatusOr<std::vector<int64_t>> v = control_ints(request, 4);
  if (!v.ok()) return Future<Message>::ready(v.status());
  // Served on arrival: a value whose destruction may run Python (and take
  // the GIL) is let go on the pool instead.
  c10::intrusive_ptr<OwnerRRef> released =
      delete_fork({static_cast<int32_t>((*v)[0]), (*v)[1]},
                  {static_cast<int32_t>((*v)[2]), (*v)[3]});
  if (released != nullptr && released->value().result().ok() &&
      !plain_value(*released->value().result())) {
    return on_pool([released](ContextState&) mutable {
      released.reset();
      return Future<Message>::ready(ack());
    });
  }
  return Future<Message>::ready(ack());
}

Future<Message> ContextState::on_fork_request(Message request) {
  absl::StatusOr<std::vector<int64_t>> v = control_ints(request, 4);
  if (!v.ok()) return Future<Message>::ready(v.status());
  const RRefId id{static_cast<int32_t>((*v)[0]), (*v)[1]};
  get_or_create_owner(id, c10::AnyType::get());
  add_fork(id, {static_cast<int32_t>((*v)[2]), (*v)[3]});
  return Future<Message>::ready(ack());
}

Future<Message> ContextState::on_child_accept(Message request) {
  absl::StatusOr<std::vector<int64_t>> v = control_ints(request, 2);
  if (!v.ok()) return Future<Message>::ready(v.status());
  c10::intrusive_ptr<RRefImpl> released;
  std::optional<std::pair<ForkId, LiveUser>> settled_user;
  {
    absl::MutexLock lock(&mu_);
    auto it =
        pending_children_.find(ForkId{static_cast<int32_t>((*v)[0]), (*v)[1]});
    if (it != pending_children_.end()) {
      released = std::move(it->second);
      pending_children_.erase(it);
      if (const auto* user = dynamic_cast<const UserRRef*>(released.get())) {
        settled_user = take_settled(user->fork_id());
      }
    }
  }
  if (settled_user) tell_deleted(settled_user->first, settled_user->second);
  return Future<Message>::ready(ack());
}

absl::StatusOr<std::shared_ptr<void>> ContextState::admit(
    const c10::IValue& call) {
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
  std::vector<ForkId> forks;
  for (const auto& rref : rrefs) {
    if (auto* user = dynamic_cast<UserRRef*>(rref.get())) {
      forks.push_back(user->fork_id());
    }
  }
  if (forks.empty()) return nullptr;
  {
    absl::MutexLock lock(&mu_);
    for (const ForkId& fork : forks) ++users_in_use_[fork];
  }
  std::weak_ptr<ContextState> weak = weak_from_this();
  return std::shared_ptr<void>(
      nullptr, [weak, forks = std::move(forks)](void*) {
        if (auto self = weak.lock()) self->done_using(forks);
      });
}

void ContextState::done_using(const std::vector<ForkId>& forks) {
  std::vector<std::pair<ForkId, LiveUser>> released;
  {
    absl::MutexLock lock(&mu_);
    for (const ForkId& fork : forks) {
      auto it = users_in_use_.find(fork);
      if (it == users_in_use_.end() || --it->second > 0) continue;
      users_in_use_.erase(it);
      if (auto user = take_settled(fork)) released.push_back(*std::move(user));
    }
  }
  for (const auto& [fork, user] : released) tell_deleted(fork, user);
}

absl::StatusOr<c10::IValue> ContextState::decode_with_hook(
    const Message& message, wire::ContextMeta* autograd) {
  absl::StatusOr<c10::IValue> value =
      absl::CancelledError("the worker is shut down");
  with_worker([&](Worker& w) { value = w.decode(message, autograd); });
  return value;
}

absl::Status ContextState::encode_response(const c10::IValue& value,
                                           const wire::ContextMeta& request,
                                           Message& out) {
  absl::Status encoded = absl::CancelledError("the worker is shut down");
  with_worker(
      [&](Worker& w) { encoded = w.encode_response(value, request, out); });
  return encoded;
}

absl::StatusOr<c10::IValue> ContextState::run_call_serving(
    const c10::IValue& call, const wire::ContextMeta& autograd) {
  absl::StatusOr<c10::IValue> result =
      absl::CancelledError("the worker shut down before the call ran");
  with_worker([&](Worker& w) {
    Worker::ServingContext serving(w, autograd);
    result = run_call(call);
  });
  return result;
}

RRefDebugInfo ContextState::debug_info() {
  absl::MutexLock lock(&mu_);
  RRefDebugInfo info;
  info.owners = static_cast<int64_t>(owners_.size());
  for (const auto& [id, forks] : forks_) info.forks += forks.size();
  info.pending_users = static_cast<int64_t>(pending_users_.size());
  info.pending_children = static_cast<int64_t>(pending_children_.size());
  return info;
}

void ContextState::drop_closed_users() {
  std::vector<c10::intrusive_ptr<RRefImpl>> dropped;
  absl::MutexLock lock(&mu_);
  dropped.swap(dropped_);
}

absl::StatusOr<std::vector<int64_t>> ContextState::control_ints(
    const Message& request, size_t n) {
  absl::StatusOr<c10::IValue> payload = wire::decode(request);
  if (!payload.ok()) return payload.status();
  return ints_of(*payload, n, message_type_name(request.type));
}
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

bool contains_rref(const c10::IValue& v) {
  if (v.isRRef()) return true;
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (contains_rref(e)) return true;
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (contains_rref(e)) return true;
    }
  } else if (v.isGenericDict()) {
    for (const auto& entry : v.toGenericDict()) {
      if (contains_rref(entry.key()) || contains_rref(entry.value())) {
        return true;
      }
    }
  } else if (const wire::Pickled* pickled = wire::Pickled::of(v)) {
    for (const c10::IValue& e : pickled->objects) {
      if (contains_rref(e)) return true;
    }
  }
  return false;
}

}  // namespace rref

}  // namespace tether
