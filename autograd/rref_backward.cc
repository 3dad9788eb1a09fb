#include "autograd/rref_backward.h"

#include <absl/strings/str_cat.h>
#include <torch/library.h>

#include "autograd/autograd.h"
#include "core/worker.h"
#include "rref/rref_impl.h"

namespace tether::autograd {
namespace {

// Backward from the value an RRef holds, on its owner (`worker`).
absl::Status owner_backward(Worker& worker, const RRef& rref,
                            int64_t context_id, bool retain_graph) {
  absl::StatusOr<c10::IValue> value = rref.local_value();
  if (!value.ok()) return value.status();
  if (!value->isTensor()) {
    // The peer's text first, which its programs match.
    return absl::InvalidArgumentError(absl::StrCat(
        "RRef should contain a tensor for .backward(); RRef ",
        rref.impl()->id().str(), " holds a ", value->tagKind()));
  }
  return backward(worker, context_id, {value->toTensor()}, retain_graph);
}

// tether::rref_backward(Any rref, int context_id, bool retain_graph): the
// owner's side of backward(rref, ...).
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

absl::Status backward(const RRef& rref, int64_t context_id, bool retain_graph) {
  absl::Status done = absl::FailedPreconditionError(
      absl::StrCat("backward() on RRef ", rref.impl()->id().str(),
                   " after its worker shut down"));
  rref.impl()->context()->with_worker([&](Worker& worker) {
    if (rref.is_owner()) {
      done = owner_backward(worker, rref, context_id, retain_graph);
      return;
    }
    done = worker
               .rpc_sync(rref.owner(), "tether::rref_backward",
                         {rref.to_ivalue(), c10::IValue(context_id),
                          c10::IValue(retain_graph)})
               .status();
  });
  return done;
}

}  // namespace tether::autograd
