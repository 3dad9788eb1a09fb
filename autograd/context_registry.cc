// The registry of distributed autograd contexts on one worker: creating,
// finding and joining contexts, and what they hold for inspection.

#include "autograd/internal/state.h"

#include <absl/strings/str_cat.h>

#include <algorithm>

namespace tether::autograd::internal {

void AutogradState::close() {
  worker_.close();
  absl::MutexLock lock(&mu_);
  contexts_.clear();
}

int64_t AutogradState::new_context() {
  const int64_t id = (static_cast<int64_t>(self_.id) << kWorkerShift) |
                     next_context_.fetch_add(1);
  absl::MutexLock lock(&mu_);
  contexts_.emplace(id, std::make_shared<ContextRecord>(id));
  return id;
}

std::shared_ptr<ContextRecord> AutogradState::find(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second;
}

std::shared_ptr<ContextRecord> AutogradState::find_or_join(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(id);
  if (it != contexts_.end()) return it->second;
  if ((id >> kWorkerShift) == self_.id) return nullptr;
  auto record = std::make_shared<ContextRecord>(id);
  contexts_.emplace(id, record);
  return record;
}

int64_t AutogradState::live() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(contexts_.size());
}

absl::Status AutogradState::backward_failed(absl::string_view what) const {
  return absl::InternalError(absl::StrCat("Error on Node ", self_.id, ": ",
                                          what, " (in the backward pass on "
                                          "worker ", describe(self_), ")"));
}

absl::Status AutogradState::unknown_context(int64_t id) const {
  return absl::NotFoundError(
      // The peer's text first: programs match it.
      absl::StrCat("Could not find autograd context with id: ", id,
                   " (no distributed autograd context ", id, " on worker ",
                   describe(self_), ": never entered, or released)"));
}

absl::StatusOr<ContextNodes> AutogradState::nodes(int64_t id) {
  std::shared_ptr<ContextRecord> record = find(id);
  if (record == nullptr) return unknown_context(id);
  ContextNodes out;
  absl::MutexLock lock(&record->mu);
  for (const auto& [message, send] : record->sends) out.sends[message] = send;
  for (const auto& [message, recv] : record->recvs) out.recvs[message] = recv;
  return out;
}

absl::StatusOr<std::vector<int32_t>> AutogradState::peers(int64_t id) {
  std::shared_ptr<ContextRecord> record = find(id);
  if (record == nullptr) return unknown_context(id);
  absl::MutexLock lock(&record->mu);
  std::vector<int32_t> out(record->peers.begin(), record->peers.end());
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> AutogradState::gradients(
    int64_t id) {
  std::shared_ptr<ContextRecord> record = find(id);
  if (record == nullptr) return unknown_context(id);
  c10::Dict<at::Tensor, at::Tensor> out;
  absl::MutexLock lock(&record->mu);
  for (const auto& [leaf, grad] : record->grads) out.insert(leaf, grad);
  return out;
}

}  // namespace tether::autograd::internal
