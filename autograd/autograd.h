// Distributed autograd: backward passes that cross workers, on LibTorch's
// own autograd engine (docs/architecture.md section 6).
//
// A Context scopes one forward and backward pass. While it is current on a
// thread, every request that thread sends (rpc_sync/rpc_async, remote,
// to_here, RRef proxy calls) belongs to it, and so does the response. A
// message that carries tensors requiring grad records a send node on its
// sender (whose next edges are those tensors' gradient edges) and gives the
// tensors on the receiver a recv node as grad_fn; the two are paired by an
// autograd message id. A request served in a context runs in it, so nested
// calls (A -> B -> C) join the same context.
//
//   // tether::init_rpc(name) (tether/tether.h) turns this layer on.
//   absl::Status step(const at::Tensor& x) {  // x requires grad
//     TETHER_ASSIGN_OR_RETURN(autograd::Context context,
//                             autograd::Context::enter());
//     TETHER_ASSIGN_OR_RETURN(
//         at::Tensor y,
//         tether::rpc_sync<at::Tensor>("w1", "aten::mul", {x, x}));
//     TETHER_RETURN_IF_ERROR(autograd::backward(context.id(), {y.sum()}));
//     auto grads = autograd::get_gradients(context.id());  // {x: 2x}
//     ...
//   }
//
// (TETHER_ASSIGN_OR_RETURN is core/status_macros.h's; never use `->` or `*`
// on a StatusOr that may hold an error: that aborts the process.)
//
// Backward (FAST mode, see docs/autograd.md): the root runs the engine from
// its roots; each gradient reaching a recv node travels back to the worker
// that sent the tensor (a BACKWARD message), which runs the engine from the
// paired send node, and so on; gradients a pass has for the worker whose
// BACKWARD it serves ride back in that message's response instead.
// backward() returns once every pass it caused, on every worker, is done.
// Gradients of leaf tensors accumulate in the context of the worker that
// holds the leaf (get_gradients), never in .grad.
//
// Ownership: a Context is movable, not copyable; it must be destroyed on the
// thread that entered it. Destroying it forgets the context here at once and
// starts releasing it on every worker that took part, without waiting for
// them (as the peer's exit does); await_releases() waits for that, and a
// graceful shutdown does before it leaves.
//
// Thread safety: every function may be called from any thread; a context is
// current only on the thread that entered it (and on the threads serving its
// requests).
#ifndef TETHER_AUTOGRAD_AUTOGRAD_H_
#define TETHER_AUTOGRAD_AUTOGRAD_H_

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/worker.h"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace tether::autograd {

namespace internal {
class AutogradState;
}  // namespace internal

// The extension that makes a Worker take part in distributed autograd; pass
// it to init_rpc / Worker::create on every worker of the group.
ExtensionFactory autograd_extension();

// A distributed autograd context, current on the entering thread while it
// lives. Ids carry the creating worker's id in their top 16 bits.
class Context {
 public:
  // Enters a new context on this thread, on `worker` (or current_worker()).
  // FAILED_PRECONDITION if a context is already current on this thread
  // (contexts do not nest) or the worker does not serve distributed
  // autograd.
  [[nodiscard]] static absl::StatusOr<Context> enter(Worker& worker);
  [[nodiscard]] static absl::StatusOr<Context> enter();

  Context(Context&& other) noexcept;
  Context& operator=(Context&& other) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context();

  int64_t id() const { return id_; }

 private:
  Context(std::weak_ptr<internal::AutogradState> state, int64_t id)
      : state_(std::move(state)), id_(id) {}
  void release();

  std::weak_ptr<internal::AutogradState> state_;
  int64_t id_ = -1;
};

// The context current on this thread; FAILED_PRECONDITION if none.
[[nodiscard]] absl::StatusOr<int64_t> current_context_id();

// Runs the distributed backward pass of `context_id` from `roots` (scalar
// tensors that require grad), on `worker` (or current_worker()), and
// returns when it is done everywhere. Errors: NOT_FOUND for a context this
// worker does not know, INVALID_ARGUMENT for a bad root, and a failure
// anywhere in the pass as "Error on worker N (name): ...". Without
// retain_graph the graph's saved tensors on this worker are freed, so a
// second backward through it fails as in LibTorch.
[[nodiscard]] absl::Status backward(Worker& worker, int64_t context_id,
                                    const std::vector<at::Tensor>& roots,
                                    bool retain_graph = false);
[[nodiscard]] absl::Status backward(int64_t context_id,
                                    const std::vector<at::Tensor>& roots,
                                    bool retain_graph = false);

// The gradients accumulated in `context_id` on `worker` (or
// current_worker()): each leaf tensor of this worker that got a gradient,
// mapped (by identity) to its gradient. NOT_FOUND for an unknown context.
[[nodiscard]] absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> get_gradients(
    Worker& worker, int64_t context_id);
[[nodiscard]] absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> get_gradients(
    int64_t context_id);

// Waits until every context released on `worker` so far (by a Context's
// destructor) is released on every worker it reached, or until `deadline`:
// DEADLINE_EXCEEDED naming how many releases are still in flight. A release
// that failed (a peer lost, or not answering within the RPC timeout) counts
// as done; it was logged as a warning, and that peer's copy goes with its
// own shutdown. FAILED_PRECONDITION without the extension.
[[nodiscard]] absl::Status await_releases(Worker& worker, absl::Time deadline);

// The ranks of the workers that context `context_id` exchanged messages
// with from `worker` (or current_worker(); its release reaches them), sorted: the peer's
// _known_worker_ids(). NOT_FOUND, with the peer's text, for a context
// `worker` does not hold (never seen, or released).
[[nodiscard]] absl::StatusOr<std::vector<int32_t>> context_peers(
    Worker& worker, int64_t context_id);
[[nodiscard]] absl::StatusOr<std::vector<int32_t>> context_peers(
    int64_t context_id);

// What `worker`'s distributed autograd holds now (the peer's
// dist_autograd._get_debug_info()): its contexts (as live_contexts) and the
// backward passes running on it: contexts with an engine pass here, each
// pass counted until the gradients it sent on are done. FAILED_PRECONDITION without the extension.
struct AutogradDebugInfo {
  int64_t contexts = 0;
  int64_t backward_passes = 0;
};
[[nodiscard]] absl::StatusOr<AutogradDebugInfo> autograd_debug_info(
    Worker& worker);

// The graph nodes context `context_id` holds on `worker`, by autograd
// message id (ordered: a worker's ids grow): a send node per message this
// worker sent with tensors that require grad (its next edges: those
// tensors' gradient edges) and a recv node per such message it received
// (grad_fn of the tensors it brought); the peer's _send_functions() and
// _recv_functions(), named as the peer's nodes. NOT_FOUND, with the peer's
// text, for a context `worker` does not hold.
struct ContextNodes {
  std::map<int64_t, std::shared_ptr<torch::autograd::Node>> sends;
  std::map<int64_t, std::shared_ptr<torch::autograd::Node>> recvs;
};
[[nodiscard]] absl::StatusOr<ContextNodes> context_nodes(Worker& worker,
                                                         int64_t context_id);

// The largest context id `worker` can make: its rank in the top 16 bits,
// a 48-bit counter below (the peer's _get_max_id(), the same scheme).
int64_t max_context_id(Worker& worker);

// How many contexts `worker` holds (its own and those it took part in);
// for tests and leak checks. FAILED_PRECONDITION without the extension.
[[nodiscard]] absl::StatusOr<int64_t> live_contexts(Worker& worker);

}  // namespace tether::autograd

#endif  // TETHER_AUTOGRAD_AUTOGRAD_H_
