#include "rref/rref.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <utility>

#include "core/ivalue_future.h"
#include "core/rpc.h"
#include "core/wire/codec.h"
#include "rref/rref_impl.h"

namespace tether {

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
  request.type = rref::kRRefFetch;
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
        "to_here() on RRef ", impl()->id().str(),
        " after its worker shut down: the RRef has been deleted. Cannot call "
        "to_here() on it after deletion."));
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
    c10::IValue call = c10::ivalue::Tuple::create(
        {std::move(call_target), c10::ivalue::Tuple::create(std::move(args)),
         kwargs_to_wire(std::move(kwargs)), c10::IValue(int64_t{id.worker}),
         c10::IValue(id.local), c10::IValue(int64_t{fork.worker}),
         c10::IValue(fork.local)});
    Message request;
    request.type = rref::kRemoteCall;
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
  c10::IValue call = c10::ivalue::Tuple::create(
      {c10::ivalue::Tuple::create(
           {rref.to_ivalue(), c10::IValue(std::string(method))}),
       c10::ivalue::Tuple::create(std::move(args)),
       kwargs_to_wire(std::move(kwargs))});
  Message request;
  request.type = rref::kRRefMethodCall;
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

ExtensionFactory rref_extension(RRefOptions options) {
  return [options](
             Worker& worker) -> absl::StatusOr<std::unique_ptr<WorkerExtension>> {
    auto extension = std::make_unique<rref::RRefExtension>(worker, options);
    std::shared_ptr<ContextState> state = extension->state();
    std::weak_ptr<ContextState> weak = state;
    // The requests that run a user function on the owner, or wait for its
    // value, count against max_calls_in_flight as calls; the control
    // messages do not. Those that run one are profiled on the owner when
    // sent under LibTorch's legacy profiler (core/profiling.h).
    // A remote() of a builtin operator, a fetch and a user's delete are
    // served on the agent's thread they arrive on (each handler hands what
    // may block, or run Python, to the pool), as a CALL is.
    struct Handler {
      MessageType type;
      Future<Message> (ContextState::*method)(Message);
      bool counts_as_call;
      bool profiled;
      bool serve_on_arrival;
    };
    const Handler handlers[] = {
        {rref::kRemoteCall, &ContextState::on_remote_call, true, true,
         true},
        {rref::kRRefFetch, &ContextState::on_fetch, true, false, true},
        {rref::kRRefUserDelete, &ContextState::on_user_delete, false,
         false, true},
        {rref::kRRefForkRequest, &ContextState::on_fork_request, false,
         false, false},
        {rref::kRRefChildAccept, &ContextState::on_child_accept, false,
         false, false},
        {rref::kRRefMethodCall, &ContextState::on_method_call, true,
         true, false},
    };
    for (const Handler& handler : handlers) {
      HandlerTraits traits;
      traits.counts_as_call = handler.counts_as_call;
      traits.profiled = handler.profiled;
      traits.serve_on_arrival = handler.serve_on_arrival;
      absl::Status added = worker.register_handler(
          handler.type, route_to(weak, handler.method), traits);
      if (!added.ok()) return added;
    }
    worker.set_call_gate(
        [weak](const c10::IValue& call) {
          auto self = weak.lock();
          if (self == nullptr) return absl::StatusOr<Worker::CallPass>(nullptr);
          return self->admit(call);
        },
        &rref::contains_rref);
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
