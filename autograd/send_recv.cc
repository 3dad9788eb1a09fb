// The ContextHook of the autograd layer: every message in a context passes
// it, and one with tensors that require grad gets a send function on its
// sender and a recv function on its receiver.

#include "autograd/internal/state.h"

#include <absl/strings/str_cat.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include "core/wire/capsules.h"

namespace tether::autograd::internal {

namespace {

// The tensors of `value` that require grad, in a fixed order (depth first,
// dict entries in insertion order), the same on both sides of the wire.
void collect_grad_tensors(const c10::IValue& value,
                          std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (t.defined() && t.requires_grad()) out.push_back(t);
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      collect_grad_tensors(element, out);
    }
  } else if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      collect_grad_tensors(element, out);
    }
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      collect_grad_tensors(entry.key(), out);
      collect_grad_tensors(entry.value(), out);
    }
  } else if (const wire::Pickled* pickled = wire::Pickled::of(value)) {
    for (const c10::IValue& object : pickled->objects) {
      collect_grad_tensors(object, out);
    }
  }
}

}  // namespace

absl::StatusOr<wire::ContextMeta> AutogradState::on_send(
    int64_t context, const WorkerInfo& to, const c10::IValue& value) {
  std::shared_ptr<ContextRecord> record = find(context);
  if (record == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot send to worker ", describe(to), " in autograd context ",
        context, ": ", unknown_context(context).message()));
  }
  std::vector<at::Tensor> tensors;
  collect_grad_tensors(value, tensors);
  wire::ContextMeta meta;
  meta.context_id = context;
  meta.from = self_.id;
  absl::MutexLock lock(&record->mu);
  if (to.id != self_.id) record->peers.insert(to.id);
  if (!tensors.empty()) {
    edge_list edges;
    edges.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      edges.push_back(torch::autograd::impl::gradient_edge(t));
    }
    meta.message_id = (static_cast<int64_t>(self_.id) << kWorkerShift) |
                      next_message_.fetch_add(1);
    auto send = std::make_shared<SendNode>(std::move(edges), to.id);
    // What the gradients coming back must fit (the engine checks them
    // against it, as against any node's inputs).
    for (const at::Tensor& t : tensors) send->add_input_metadata(t);
    record->sends.emplace(meta.message_id, std::move(send));
  }
  return meta;
}

absl::Status AutogradState::on_receive(const wire::ContextMeta& meta,
                                       c10::IValue& value) {
  std::shared_ptr<ContextRecord> record = find_or_join(meta.context_id);
  if (record == nullptr) return absl::OkStatus();  // released here already
  {
    absl::MutexLock lock(&record->mu);
    if (meta.from != self_.id) record->peers.insert(meta.from);
  }
  if (meta.message_id < 0) return absl::OkStatus();
  std::vector<at::Tensor> tensors;
  collect_grad_tensors(value, tensors);
  if (tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "autograd message ", meta.message_id, " of context ",
        meta.context_id, " from worker ", meta.from,
        " carries no tensor that requires grad"));
  }
  auto recv = std::make_shared<RecvNode>(meta.context_id, meta.message_id,
                                         meta.from);
  for (at::Tensor& t : tensors) {
    if (!torch::autograd::isDifferentiableType(t.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "autograd message ", meta.message_id, " from worker ", meta.from,
          ": a tensor of dtype ", c10::toString(t.scalar_type()),
          " cannot require grad"));
    }
    t.set_requires_grad(false);  // a received leaf; its history follows
    torch::autograd::set_history(t, recv);
  }
  absl::MutexLock lock(&record->mu);
  record->recvs.emplace(meta.message_id, std::move(recv));
  return absl::OkStatus();
}

}  // namespace tether::autograd::internal
