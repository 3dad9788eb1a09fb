// RRef: a reference to a value that lives on one worker (its owner), usable
// from any worker, like torch.distributed.rpc's RRef.
//
// remote() runs a function on a worker and leaves its result there; the
// caller gets an RRef at once. RRefs travel as arguments and results of
// rpc_sync / rpc_async / remote, nested in lists, tuples and dicts, between
// any workers; the owner learns of every user reference and of its deletion,
// and frees the value when the last one is gone (the protocol is in
// rref/rref_impl.h and docs/rref.md).
//
// A Worker serves RRefs when it is built with rref_extension():
//
//   tether::init_rpc("w0", 0, 2, options, registry, {tether::rref_extension()});
//   absl::StatusOr<tether::RRef> r =
//       tether::remote("w1", "aten::add.Tensor", {a, b});
//   if (!r.ok()) return r.status();  // never `->` on a failed StatusOr
//   absl::StatusOr<c10::IValue> sum = r->to_here();
//
// Thread safety: an RRef may be copied and used from any thread.
#ifndef TETHER_RREF_RREF_H_
#define TETHER_RREF_RREF_H_

#include <ATen/core/ivalue.h>
#include <ATen/core/rref_interface.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <string>
#include <utility>
#include <vector>

#include "core/native_function.h"
#include "core/typed_result.h"
#include "core/worker.h"

namespace tether {

namespace rref {
class RRefImpl;
}  // namespace rref

class RRef;

// Proxies run a method of the object an RRef holds (an instance of a
// TORCH_LIBRARY custom class) on its owner, by name:
//   rref.rpc_sync().call("forward", {x})   -> StatusOr<IValue>
//   rref.rpc_async().call("forward", {x})  -> Future<IValue>
//   rref.remote().call("forward", {x})     -> StatusOr<RRef> (result stays)
// A missing method is NOT_FOUND naming it and the class.
class SyncProxy {
 public:
  SyncProxy(const RRef& rref, absl::Duration timeout)
      : rref_(rref), timeout_(timeout) {}
  [[nodiscard]] absl::StatusOr<c10::IValue> call(
      absl::string_view method, std::vector<c10::IValue> args = {},
      Kwargs kwargs = {}) const;

 private:
  const RRef& rref_;
  absl::Duration timeout_;
};

class AsyncProxy {
 public:
  AsyncProxy(const RRef& rref, absl::Duration timeout)
      : rref_(rref), timeout_(timeout) {}
  Future<c10::IValue> call(absl::string_view method,
                           std::vector<c10::IValue> args = {},
                           Kwargs kwargs = {}) const;

 private:
  const RRef& rref_;
  absl::Duration timeout_;
};

class RemoteProxy {
 public:
  RemoteProxy(const RRef& rref, absl::Duration timeout)
      : rref_(rref), timeout_(timeout) {}
  [[nodiscard]] absl::StatusOr<RRef> call(absl::string_view method,
                                          std::vector<c10::IValue> args = {},
                                          Kwargs kwargs = {}) const;

 private:
  const RRef& rref_;
  absl::Duration timeout_;
};

class RRef {
 public:
  // An empty handle; only assignment and valid() may be used on it.
  RRef() = default;

  // A new RRef owned by the calling worker (or `worker`), holding `value`.
  [[nodiscard]] static absl::StatusOr<RRef> local(c10::IValue value);
  [[nodiscard]] static absl::StatusOr<RRef> local(Worker& worker,
                                                  c10::IValue value);

  // The RRef inside a value received from a call (INVALID_ARGUMENT if the
  // value is not one).
  [[nodiscard]] static absl::StatusOr<RRef> from_ivalue(const c10::IValue& v);

  // As an argument of rpc_sync / rpc_async / remote.
  c10::IValue to_ivalue() const;
  operator c10::IValue() const { return to_ivalue(); }  // NOLINT

  bool valid() const { return impl_ != nullptr; }

  // The value: fetched from the owner, or the owner's own once ready.
  // Errors: the creation error of remote() ("RRef creation failed: ..."),
  // DEADLINE_EXCEEDED past `timeout`, UNAVAILABLE for a lost owner.
  [[nodiscard]] absl::StatusOr<c10::IValue> to_here(
      absl::Duration timeout = kDefaultTimeout) const;
  // The same as a T (core/typed_result.h): INVALID_ARGUMENT naming both
  // types when the value is another type.
  template <typename T>
  [[nodiscard]] absl::StatusOr<T> to_here(
      absl::Duration timeout = kDefaultTimeout) const {
    absl::StatusOr<c10::IValue> value = to_here(timeout);
    if (!value.ok()) return value.status();
    return value_as<T>(*std::move(value), "the RRef's value");
  }

  // The owner's value, on the owner only (FAILED_PRECONDITION elsewhere).
  [[nodiscard]] absl::StatusOr<c10::IValue> local_value() const;
  template <typename T>
  [[nodiscard]] absl::StatusOr<T> local_value() const {
    absl::StatusOr<c10::IValue> value = local_value();
    if (!value.ok()) return value.status();
    return value_as<T>(*std::move(value), "the RRef's value");
  }

  WorkerInfo owner() const;
  std::string owner_name() const;
  bool is_owner() const;
  // True on the owner, and on a user once the owner has registered it. May
  // still be false just after to_here() succeeded: the value can overtake
  // the owner's acknowledgement.
  bool confirmed_by_owner() const;
  // The RRef's global id and, on a user, its fork's id, each as (the worker
  // that made it, its local number); fork_id() is {-1, -1} on the owner.
  // The Python binding prints them as the peer does (GloballyUniqueId).
  std::pair<int32_t, int64_t> id() const;
  std::pair<int32_t, int64_t> fork_id() const;

  // Completes with true once the value exists on its owner, or with the
  // error its creation met ("RRef creation failed: ..."): how a caller of
  // remote() learns whether the call succeeded without fetching the value
  // (the peer's rref._get_future()). On a user that received the RRef from
  // another worker, true once the owner has registered this user.
  //
  //   absl::StatusOr<RRef> r = tether::remote("w1", "my_init", {});
  //   if (!r.ok()) return r.status();
  //   absl::StatusOr<bool> made = r->get_future().get(absl::Now() + bound);
  //   if (!made.ok()) return made.status();  // the creation's error
  Future<bool> get_future() const;

  // Distributed backward from the value: autograd::backward(rref, ...) in
  // autograd/rref_backward.h (the autograd layer sits above this one).

  // Method calls on the owner's object (see SyncProxy above). The proxy
  // refers to this RRef: use it within the expression.
  SyncProxy rpc_sync(absl::Duration timeout = kDefaultTimeout) const {
    return SyncProxy(*this, timeout);
  }
  AsyncProxy rpc_async(absl::Duration timeout = kDefaultTimeout) const {
    return AsyncProxy(*this, timeout);
  }
  RemoteProxy remote(absl::Duration timeout = kDefaultTimeout) const {
    return RemoteProxy(*this, timeout);
  }

  // Internal: `impl` is a rref::RRefImpl.
  explicit RRef(c10::intrusive_ptr<c10::RRefInterface> impl);
  rref::RRefImpl* impl() const;

 private:
  c10::intrusive_ptr<c10::RRefInterface> impl_;
};

// RRefs as parameters and results of registered functions
// (core/native_function.h):
//   worker.register_function("f", [](const tether::RRef& r) { ... });
template <>
struct NativeConverter<RRef> {
  static RRef from(c10::IValue& value) {
    absl::StatusOr<RRef> rref = RRef::from_ivalue(value);
    if (!rref.ok()) throw StatusError(rref.status());
    return *std::move(rref);
  }
  static c10::IValue to(const RRef& rref) { return rref.to_ivalue(); }
};

// Runs `fn` on `to` and keeps its result there. Returns at once; a failure
// of the call is recorded on the RRef and reported by its first use.
// Errors here: FAILED_PRECONDITION without a worker serving RRefs,
// NOT_FOUND for an unknown worker, INVALID_ARGUMENT for arguments that
// cannot be sent.
[[nodiscard]] absl::StatusOr<RRef> remote(
    const To& to, absl::string_view fn, std::vector<c10::IValue> args,
    Kwargs kwargs = {}, absl::Duration timeout = kDefaultTimeout);
// The same from an explicit worker (several workers in one process).
[[nodiscard]] absl::StatusOr<RRef> remote(
    Worker& worker, const To& to, absl::string_view fn,
    std::vector<c10::IValue> args, Kwargs kwargs = {},
    absl::Duration timeout = kDefaultTimeout);

struct RRefOptions {
  // Graceful shutdown fails, naming them, if RRefs owned here still have
  // users once every worker has released its own (a leak).
  bool leak_check = false;
};

// The extension that makes a Worker serve RRefs (see Worker::create). At a
// graceful shutdown it releases every user reference the application still
// holds (telling their owners), so the drain barrier that follows waits for
// the owners to learn of it.
ExtensionFactory rref_extension(RRefOptions options = RRefOptions());

// Counts for tests and debugging, of the calling thread's worker.
struct RRefDebugInfo {
  int64_t owners = 0;          // OwnerRRefs this worker keeps for others
  int64_t forks = 0;           // user references the owners know of
  int64_t pending_users = 0;   // users here not yet confirmed by the owner
  int64_t pending_children = 0;  // forks sent on, awaiting the owner
};
[[nodiscard]] absl::StatusOr<RRefDebugInfo> rref_debug_info(Worker& worker);

}  // namespace tether

#endif  // TETHER_RREF_RREF_H_
