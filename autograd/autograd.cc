#include "autograd/autograd.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>
#include <glog/logging.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <utility>
#include <vector>

#include "autograd/internal/state.h"
#include "autograd/messages.h"
#include "core/rpc.h"

namespace tether::autograd {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace internal {

namespace {

class AutogradExtension final : public WorkerExtension {
 public:
  explicit AutogradExtension(Worker& worker)
      : state_(std::make_shared<AutogradState>(worker)) {}
  ~AutogradExtension() override { state_->close(); }

  // The contexts this worker released reach every peer before it leaves.
  absl::Status before_graceful_join() override {
    absl::Duration bound = absl::Seconds(60);
    state_->with_worker([&](Worker& worker) {
      bound = worker.resolve_timeout(kDefaultTimeout);
    });
    absl::Status released = state_->await_releases(absl::Now() + bound);
    if (!released.ok()) LOG(WARNING) << "graceful shutdown: " << released;
    return absl::OkStatus();
  }

  ContextHook* context_hook() override { return state_.get(); }

  const std::shared_ptr<AutogradState>& state() const { return state_; }

 private:
  std::shared_ptr<AutogradState> state_;
};

}  // namespace

std::shared_ptr<AutogradState> state_of(Worker& worker) {
  auto* extension = worker.extension<AutogradExtension>();
  return extension == nullptr ? nullptr : extension->state();
}

}  // namespace internal

using internal::AutogradState;
using internal::ContextRecord;

namespace {

absl::Status no_extension(const Worker& worker) {
  return absl::FailedPreconditionError(absl::StrCat(
      "worker '", worker.get_current_worker_info().name,
      "' does not serve distributed autograd (pass "
      "autograd::autograd_extension() at init)"));
}

absl::StatusOr<Worker*> default_worker() {
  Worker* worker = current_worker();
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        "no RPC worker: call tether::init_rpc() first");
  }
  return worker;
}

// Frees the saved tensors of every node reachable from `roots`, as a
// backward without retain_graph does in LibTorch.
void release_graph(const std::vector<at::Tensor>& roots) {
  absl::flat_hash_set<Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  for (const at::Tensor& root : roots) {
    if (auto fn = root.grad_fn()) stack.push_back(std::move(fn));
  }
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(node.get()).second) continue;
    node->release_variables();
    for (const Edge& next : node->next_edges()) {
      if (next.function != nullptr) stack.push_back(next.function);
    }
  }
}

}  // namespace

ExtensionFactory autograd_extension() {
  return [](Worker& worker)
             -> absl::StatusOr<std::unique_ptr<WorkerExtension>> {
    auto extension = std::make_unique<internal::AutogradExtension>(worker);
    std::weak_ptr<AutogradState> weak = extension->state();
    absl::Status added =
        worker.register_handler(kAutogradBackward,
                                route_to(weak, &AutogradState::on_backward));
    if (!added.ok()) return added;
    added = worker.register_handler(kAutogradCleanup,
                                    route_to(weak, &AutogradState::on_cleanup));
    if (!added.ok()) return added;
    return extension;
  };
}

absl::StatusOr<Context> Context::enter(Worker& worker) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  if (internal::thread_context >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Already have an autograd context id for this thread: distributed "
        "autograd context ", internal::thread_context,
        " is current here; contexts do not nest"));
  }
  const int64_t id = state->new_context();
  internal::thread_context = id;
  return Context(state, id);
}

absl::StatusOr<Context> Context::enter() {
  absl::StatusOr<Worker*> worker = default_worker();
  if (!worker.ok()) return worker.status();
  return enter(**worker);
}

Context::Context(Context&& other) noexcept
    : state_(std::move(other.state_)), id_(std::exchange(other.id_, -1)) {}

Context& Context::operator=(Context&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    id_ = std::exchange(other.id_, -1);
  }
  return *this;
}

Context::~Context() { release(); }

void Context::release() {
  if (id_ < 0) return;
  if (internal::thread_context == id_) internal::thread_context = -1;
  std::shared_ptr<AutogradState> state = state_.lock();
  const int64_t id = std::exchange(id_, -1);
  if (state == nullptr) return;
  state->release(id);
}

absl::StatusOr<int64_t> current_context_id() {
  if (internal::thread_context < 0) {
    return absl::FailedPreconditionError(
        "no distributed autograd context is current on this thread");
  }
  return internal::thread_context;
}

absl::Status backward(Worker& worker, int64_t context_id,
                      const std::vector<at::Tensor>& roots,
                      bool retain_graph) {
  // The peer's event name, which profiles show.
  RECORD_FUNCTION("torch::distributed::autograd::backward",
                  std::vector<c10::IValue>());
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  std::shared_ptr<ContextRecord> record = state->find(context_id);
  if (record == nullptr) return state->unknown_context(context_id);
  // The peer's texts, which programs match, then ours.
  if (roots.empty()) {
    return absl::InvalidArgumentError(
        "No tensors provided for gradient computation: backward needs at "
        "least one root");
  }
  edge_list edges;
  variable_list grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const at::Tensor& root = roots[i];
    if (!root.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("root ", i, " of backward is an undefined tensor"));
    }
    if (!root.requires_grad()) {
      return absl::InvalidArgumentError(
          absl::StrCat("requires_grad not set on root ", i,
                       " of backward: it does not require grad, and a root "
                       "must be a scalar that requires grad"));
    }
    if (root.numel() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "root ", i, " of backward must be a scalar that requires grad: it "
          "is not a scalar, all roots need to be scalar (it has ",
          root.numel(), " elements)"));
    }
    if (root.grad_fn() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "root ", i, " of backward does not have a valid gradient function: "
          "it is a leaf, which no operation computed"));
    }
    edges.push_back(torch::autograd::impl::gradient_edge(root));
    grads.push_back(at::ones_like(root, c10::MemoryFormat::Contiguous));
  }
  auto drain = std::make_shared<internal::Drain>();
  internal::PassScope scope{record, retain_graph, /*requester=*/-1, drain};
  absl::StatusOr<internal::Returned> done =
      internal::Drain::run_until(drain, state->pass(scope, edges, grads));
  if (!retain_graph) release_graph(roots);
  return done.status();
}

absl::Status backward(int64_t context_id, const std::vector<at::Tensor>& roots,
                      bool retain_graph) {
  absl::StatusOr<Worker*> worker = default_worker();
  if (!worker.ok()) return worker.status();
  return backward(**worker, context_id, roots, retain_graph);
}

absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> get_gradients(
    Worker& worker, int64_t context_id) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  return state->gradients(context_id);
}

absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> get_gradients(
    int64_t context_id) {
  absl::StatusOr<Worker*> worker = default_worker();
  if (!worker.ok()) return worker.status();
  return get_gradients(**worker, context_id);
}

absl::Status await_releases(Worker& worker, absl::Time deadline) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  return state->await_releases(deadline);
}

absl::StatusOr<std::vector<int32_t>> context_peers(Worker& worker,
                                                   int64_t context_id) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  return state->peers(context_id);
}

absl::StatusOr<ContextNodes> context_nodes(Worker& worker,
                                          int64_t context_id) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  return state->nodes(context_id);
}

absl::StatusOr<std::vector<int32_t>> context_peers(int64_t context_id) {
  absl::StatusOr<Worker*> worker = default_worker();
  if (!worker.ok()) return worker.status();
  return context_peers(**worker, context_id);
}

absl::StatusOr<AutogradDebugInfo> autograd_debug_info(Worker& worker) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  return AutogradDebugInfo{state->live(), state->backward_passes()};
}

int64_t max_context_id(Worker& worker) {
  constexpr int kShift = internal::kWorkerShift;
  return (static_cast<int64_t>(worker.get_current_worker_info().id) << kShift) |
         ((int64_t{1} << kShift) - 1);
}

absl::StatusOr<int64_t> live_contexts(Worker& worker) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  return state->live();
}

}  // namespace tether::autograd
