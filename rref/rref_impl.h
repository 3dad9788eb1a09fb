// The RRef layer's internals: owner and user references, and the per-worker
// context that runs the protocol. Only rref/ includes this header.
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
//     confirmed (Worker::set_call_gate).
//   - Control messages are idempotent and retried with backoff; user calls
//     (REMOTE_CALL) are never retried.
#ifndef TETHER_RREF_RREF_IMPL_H_
#define TETHER_RREF_RREF_IMPL_H_

#include <ATen/core/ivalue.h>
#include <ATen/core/rref_interface.h>
#include <absl/hash/hash.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/future.h"
#include "core/worker.h"
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
