#include "autograd/autograd.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <glog/logging.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "autograd/messages.h"
#include "core/rpc.h"
#include "core/wire/codec.h"

namespace tether::autograd {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace internal {

namespace {

// The context current on this thread: entered by the user, or the context of
// the request this thread serves. One per thread, whatever the worker.
thread_local int64_t thread_context = -1;

// Context ids: the creating worker's id above this bit.
constexpr int kWorkerShift = 48;

std::string describe(const WorkerInfo& info) {
  return absl::StrCat(info.id, " (", info.name, ")");
}

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

// The sender's half of a message pair: its next edges are the gradient
// edges of the tensors the message carried. The engine never runs it; a
// BACKWARD message starts a pass from its next edges.
class SendNode final : public Node {
 public:
  SendNode(edge_list edges, int32_t to) : Node(std::move(edges)), to_(to) {}

  variable_list apply(variable_list&& grads) override {
    return std::move(grads);
  }
  // The peer's name, which programs inspecting a graph match.
  std::string name() const override {
    return "torch::distributed::autograd::SendRpcBackward";
  }

  int32_t to() const { return to_; }

 private:
  const int32_t to_;
};

// The receiver's half: grad_fn of the tensors a message brought. A pass
// captures the gradients flowing into it and ships them to `from`.
class RecvNode final : public Node {
 public:
  RecvNode(int64_t context, int64_t message, int32_t from)
      : context_(context), message_(message), from_(from) {}

  // Only a local (non-distributed) backward gets here.
  variable_list apply(variable_list&& /*grads*/) override {
    TORCH_CHECK(false, "a tensor that came from worker ", from_,
                " in distributed autograd context ", context_,
                " was reached by a local backward; run "
                "tether::autograd::backward(context_id, roots) instead");
  }
  std::string name() const override {
    return "torch::distributed::autograd::RecvRpcBackward";
  }

  int64_t context() const { return context_; }
  int64_t message() const { return message_; }
  int32_t from() const { return from_; }

 private:
  const int64_t context_;
  const int64_t message_;
  const int32_t from_;
};

// One context on one worker.
struct ContextRecord {
  explicit ContextRecord(int64_t id) : id(id) {}

  const int64_t id;
  absl::Mutex mu;
  // Send nodes by autograd message id.
  absl::flat_hash_map<int64_t, std::shared_ptr<SendNode>> sends
      ABSL_GUARDED_BY(mu);
  // Recv nodes by the message id their sender gave (ids are unique: the
  // sender's id is in their top bits), kept while the context lives, as
  // the peer's context keeps them.
  absl::flat_hash_map<int64_t, std::shared_ptr<RecvNode>> recvs
      ABSL_GUARDED_BY(mu);
  // Workers this context exchanged messages with: cleanup reaches them.
  absl::flat_hash_set<int32_t> peers ABSL_GUARDED_BY(mu);
  // Leaf -> gradient, in the order leaves first got one.
  std::vector<std::pair<at::Tensor, at::Tensor>> grads ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<const c10::TensorImpl*, size_t> grad_index
      ABSL_GUARDED_BY(mu);
  // Engine passes of this context on this worker run one at a time.
  absl::Mutex engine_mu;
};

// Gradients a pass has for recv nodes of the worker whose BACKWARD it
// serves: they go back in that BACKWARD's response (an
// AUTOGRAD_BACKWARD_RET), not in a BACKWARD of their own, which saves a
// round trip per level of a backward that comes back to its caller.
struct ReturnedGrads {
  int64_t message;  // the autograd message id of the requester's send node
  c10::List<at::Tensor> grads;
};
using Returned = std::vector<ReturnedGrads>;

// Completes with the first error among `futures`, or once all are done with
// `own` followed by what each of them returned.
Future<Returned> gather(const std::vector<Future<Returned>>& futures,
                        Returned own) {
  if (futures.empty()) return Future<Returned>::ready(std::move(own));
  struct Gather {
    absl::Mutex mu;
    Returned all ABSL_GUARDED_BY(mu);
    size_t left ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<Gather>();
  {
    absl::MutexLock lock(&state->mu);
    state->all = std::move(own);
    state->left = futures.size();
  }
  Promise<Returned> done;
  for (Future<Returned> future : futures) {
    future.on_complete([state, done](const absl::StatusOr<Returned>& result) {
      if (!result.ok()) {
        done.set(result.status());
        return;
      }
      Returned all;
      {
        absl::MutexLock lock(&state->mu);
        state->all.insert(state->all.end(), result->begin(), result->end());
        if (--state->left > 0) return;
        all.swap(state->all);
      }
      done.set(std::move(all));
    });
  }
  return done.future();
}

// Work for the thread that waits in the root's backward(): the passes for
// gradients that responses return to the root run there instead of on a
// thread woken for them (one wake-up less per returned hop). Work posted
// after that wait ended (an error ended it first) goes to at::launch. The
// thread waits on a Future, so it waits as every future wait does (and
// polls first when RpcOptions::busy_poll asks for it).
class Drain {
 public:
  void post(std::function<void()> work) {
    Promise<bool> wake;
    bool closed;
    {
      absl::MutexLock lock(&mu_);
      closed = closed_;
      if (!closed) {
        queue_.push_back(std::move(work));
        wake = std::exchange(wake_, Promise<bool>());
      }
    }
    if (closed) {
      at::launch(std::move(work));
      return;
    }
    wake.set(true);  // never under mu_: a completer holds no lock
  }

  // Runs what is posted until `done` completes; returns its result.
  static absl::StatusOr<Returned> run_until(const std::shared_ptr<Drain>& drain,
                                            Future<Returned> done) {
    done.on_complete([drain](const absl::StatusOr<Returned>& /*result*/) {
      Promise<bool> wake;
      {
        absl::MutexLock lock(&drain->mu_);
        drain->finished_ = true;
        wake = std::exchange(drain->wake_, Promise<bool>());
      }
      wake.set(true);
    });
    for (;;) {
      std::function<void()> work;
      Future<bool> woken;
      {
        absl::MutexLock lock(&drain->mu_);
        if (!drain->queue_.empty()) {
          work = std::move(drain->queue_.front());
          drain->queue_.pop_front();
        } else if (drain->finished_) {
          drain->closed_ = true;
          break;
        } else {
          woken = drain->wake_.future();
        }
      }
      if (work) {
        work();
      } else {
        (void)woken.wait(absl::InfiniteFuture());
      }
    }
    return done.result();
  }

 private:
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // Completed (and replaced) when work is posted or the wait is over.
  Promise<bool> wake_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// What the passes of one backward on one worker share.
struct PassScope {
  std::shared_ptr<ContextRecord> record;
  bool retain_graph = false;
  // The worker whose BACKWARD these passes serve: gradients for its recv
  // nodes go back in the response. -1 at the root.
  int32_t requester = -1;
  // At the root: its waiting thread, which runs the passes for returned
  // gradients. Null elsewhere (at::launch runs them).
  std::shared_ptr<Drain> drain;
};

// Completes with the first error among `futures`, or OK once all are done.
Future<bool> all_of(const std::vector<Future<bool>>& futures) {
  if (futures.empty()) return Future<bool>::ready(true);
  Promise<bool> done;
  auto left = std::make_shared<std::atomic<size_t>>(futures.size());
  for (Future<bool> future : futures) {
    future.on_complete([done, left](const absl::StatusOr<bool>& result) {
      if (!result.ok()) done.set(result.status());
      if (left->fetch_sub(1) == 1) done.set(true);
    });
  }
  return done.future();
}

}  // namespace

// The autograd layer of one Worker: its contexts, the hook every message
// goes through, and the BACKWARD and CLEANUP handlers.
class AutogradState final : public ContextHook,
                            public std::enable_shared_from_this<AutogradState> {
 public:
  explicit AutogradState(Worker& worker)
      : worker_(&worker), self_(worker.get_current_worker_info()) {}

  const WorkerInfo& self() const { return self_; }

  // Runs fn(worker) unless closed; true if it ran.
  template <typename F>
  bool with_worker(F fn) {
    Worker* worker;
    {
      absl::MutexLock lock(&mu_);
      if (worker_ == nullptr) return false;
      worker = worker_;
      ++in_use_;
    }
    fn(*worker);
    absl::MutexLock lock(&mu_);
    --in_use_;
    return true;
  }

  // The worker is going away: waits out the calls that use it.
  void close() {
    absl::MutexLock lock(&mu_);
    worker_ = nullptr;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return in_use_ == 0;
    };
    mu_.Await(absl::Condition(&idle));
    contexts_.clear();
  }

  // ---- contexts

  int64_t new_context() {
    const int64_t id = (static_cast<int64_t>(self_.id) << kWorkerShift) |
                       next_context_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    contexts_.emplace(id, std::make_shared<ContextRecord>(id));
    return id;
  }

  std::shared_ptr<ContextRecord> find(int64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second;
  }

  // A context another worker created, first seen here; null for one of this
  // worker's own that is gone already.
  std::shared_ptr<ContextRecord> find_or_join(int64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(id);
    if (it != contexts_.end()) return it->second;
    if ((id >> kWorkerShift) == self_.id) return nullptr;
    auto record = std::make_shared<ContextRecord>(id);
    contexts_.emplace(id, record);
    return record;
  }

  int64_t live() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(contexts_.size());
  }

  // The peer's text ("Error on Node <rank>: <what>"), then where.
  absl::Status backward_failed(absl::string_view what) const {
    return absl::InternalError(absl::StrCat("Error on Node ", self_.id, ": ",
                                            what, " (in the backward pass on "
                                            "worker ", describe(self_), ")"));
  }

  absl::Status unknown_context(int64_t id) const {
    return absl::NotFoundError(
        // The peer's text first: programs match it.
        absl::StrCat("Could not find autograd context with id: ", id,
                     " (no distributed autograd context ", id, " on worker ",
                     describe(self_), ": never entered, or released)"));
  }

  // ---- ContextHook

  int64_t current_context() const override { return thread_context; }

  int64_t exchange_current_context(int64_t context) override {
    return std::exchange(thread_context, context);
  }

  absl::StatusOr<wire::ContextMeta> on_send(
      int64_t context, const WorkerInfo& to,
      const c10::IValue& value) override {
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

  absl::Status on_receive(const wire::ContextMeta& meta,
                          c10::IValue& value) override {
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

  // ---- backward

  // One engine pass on this worker from `roots` with `grads` (defined,
  // matching): leaf gradients accumulate in the context, gradients reaching
  // recv nodes go back to their senders, except those of scope.requester
  // (the worker whose BACKWARD this pass serves), which the returned future
  // carries for the response. Completes when every BACKWARD message it sent
  // is done (first error wins), with what they returned for the requester
  // too.
  Future<Returned> pass(const PassScope& scope, const edge_list& roots,
                        const variable_list& grads) {
    passes_->fetch_add(1);
    Future<Returned> done = run_pass(scope, roots, grads);
    done.on_complete(
        [passes = passes_](const absl::StatusOr<Returned>&) {
          passes->fetch_sub(1);
        });
    return done;
  }

  // Engine passes running on this worker, each counted until everything it
  // sent on is done (the peer's num_current_backward_passes).
  int64_t backward_passes() const { return passes_->load(); }

  Future<Returned> run_pass(const PassScope& scope, const edge_list& roots,
                            const variable_list& grads) {
    const std::shared_ptr<ContextRecord>& record = scope.record;
    // What the pass computes: every leaf and recv node it can reach.
    std::vector<std::shared_ptr<Node>> leaves;
    std::vector<std::shared_ptr<RecvNode>> recvs;
    {
      absl::flat_hash_set<Node*> seen;
      std::vector<std::shared_ptr<Node>> stack;
      auto visit = [&](const std::shared_ptr<Node>& node) {
        if (node == nullptr || !seen.insert(node.get()).second) return;
        if (dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())) {
          leaves.push_back(node);
        } else if (auto recv = std::dynamic_pointer_cast<RecvNode>(node)) {
          recvs.push_back(std::move(recv));
        } else {
          stack.push_back(node);
        }
      };
      for (const Edge& root : roots) visit(root.function);
      while (!stack.empty()) {
        std::shared_ptr<Node> node = std::move(stack.back());
        stack.pop_back();
        for (const Edge& next : node->next_edges()) visit(next.function);
      }
    }
    edge_list outputs;
    for (const auto& leaf : leaves) outputs.emplace_back(leaf, 0);
    for (const auto& recv : recvs) {
      for (uint32_t i = 0; i < recv->num_inputs(); ++i) {
        outputs.emplace_back(recv, i);
      }
    }
    if (outputs.empty()) return Future<Returned>::ready(Returned());

    variable_list results;
    {
      absl::MutexLock engine(&record->engine_mu);
      try {
        // The graph is kept: another pass of this backward (a gradient
        // arriving at another send node) may go through the same nodes.
        results = torch::autograd::Engine::get_default_engine().execute(
            roots, grads, /*keep_graph=*/true, /*create_graph=*/false,
            /*accumulate_grad=*/false, outputs);
      } catch (const c10::Error& e) {
        return Future<Returned>::ready(
            backward_failed(e.what_without_backtrace()));
      } catch (const std::exception& e) {
        return Future<Returned>::ready(backward_failed(e.what()));
      }
    }
    accumulate(*record, leaves, results);
    std::vector<Future<Returned>> sent;
    Returned own;
    size_t next = leaves.size();
    for (const auto& recv : recvs) {
      c10::List<at::Tensor> recv_grads;
      bool any = false;
      for (uint32_t i = 0; i < recv->num_inputs(); ++i, ++next) {
        any = any || results[next].defined();
        recv_grads.push_back(results[next]);
      }
      if (!any) continue;
      if (recv->from() == scope.requester) {
        own.push_back({recv->message(), std::move(recv_grads)});
      } else {
        sent.push_back(send_backward(scope, *recv, std::move(recv_grads)));
      }
    }
    return gather(sent, std::move(own));
  }

  // A pass from the send node of autograd message `message` with the
  // gradients `incoming` (one per tensor it sent; undefined: none), for a
  // BACKWARD that arrived or gradients returned in a BACKWARD's response.
  Future<Returned> pass_from_send(const PassScope& scope, int64_t message,
                                  std::vector<at::Tensor> incoming) {
    const std::shared_ptr<ContextRecord>& record = scope.record;
    std::shared_ptr<SendNode> send;
    {
      absl::MutexLock lock(&record->mu);
      auto it = record->sends.find(message);
      if (it != record->sends.end()) send = it->second;
    }
    if (send == nullptr) {
      return Future<Returned>::ready(absl::NotFoundError(absl::StrCat(
          "Error on worker ", describe(self_), ": no autograd message ",
          message, " in context ", record->id)));
    }
    if (incoming.size() != send->next_edges().size()) {
      return Future<Returned>::ready(absl::InvalidArgumentError(absl::StrCat(
          "Error on worker ", describe(self_), ": ", incoming.size(),
          " gradients for autograd message ", message, " which sent ",
          send->next_edges().size(), " tensors")));
    }
    // The pass starts at the send node, as the peer's: profiles and hooks
    // see it run.
    edge_list roots;
    variable_list grads;
    for (size_t i = 0; i < incoming.size(); ++i) {
      if (!incoming[i].defined()) continue;
      roots.emplace_back(send, static_cast<uint32_t>(i));
      grads.push_back(std::move(incoming[i]));
    }
    if (roots.empty()) return Future<Returned>::ready(Returned());
    if (scope.requester != kFromSendNode) return pass(scope, roots, grads);
    PassScope served = scope;
    served.requester = send->to();
    return pass(served, roots, grads);
  }

  // pass_from_send's requester for a BACKWARD that arrived: the worker the
  // send node sent to, which is the one whose gradients came back.
  static constexpr int32_t kFromSendNode = -2;

  // The passes for gradients that a BACKWARD's response returned: on the
  // root's waiting thread (scope.drain), elsewhere on an inter-op thread of
  // LibTorch (at::launch). Never on the thread that completed the response,
  // a backend thread, which must not run an engine pass. Their own returns
  // are for scope.requester, whose pass sent that BACKWARD.
  Future<Returned> run_returned(const PassScope& scope,
                                std::vector<ReturnedGrads> returned) {
    Promise<Returned> done;
    std::shared_ptr<AutogradState> self = shared_from_this();
    std::function<void()> work = [self, scope, returned = std::move(returned),
                                  done]() mutable {
      std::vector<Future<Returned>> passes;
      for (ReturnedGrads& entry : returned) {
        passes.push_back(
            self->pass_from_send(scope, entry.message, entry.grads.vec()));
      }
      gather(passes, Returned())
          .on_complete([done](const absl::StatusOr<Returned>& result) {
            done.set(result);
          });
    };
    if (scope.drain != nullptr) {
      scope.drain->post(std::move(work));
    } else {
      at::launch(std::move(work));
    }
    return done.future();
  }

  // Adds the gradients this pass computed for `leaves` (the first of
  // `results`) to the context, as the peer's engine does: each leaf's
  // AccumulateGrad pre-hooks and tensor hooks change the gradient first,
  // its post-hooks see it after, and a gradient nothing else holds is kept
  // without a copy (AccumulateGrad's own rule; one that `results` holds for
  // another leaf too is copied, as the peer holds every result until all
  // are accumulated).
  // Accumulates each leaf's gradient into the context, then runs the
  // leaf's post hooks. Those run inside a graph task of LibTorch's engine
  // (as the engine runs an AccumulateGrad's), so that a hook may queue a
  // final callback (Engine::queue_callback), which runs before this
  // returns. A hook reads and writes a leaf's gradient where local
  // autograd keeps it, in .grad: DistributedDataParallel's reducer copies
  // it into its buckets and writes the all-reduced average back at the
  // end of the graph task. So while the hooks run, .grad holds the
  // context's gradient; what it holds afterwards becomes the context's,
  // and the leaf's own .grad is put back.
  void accumulate(ContextRecord& record,
                  const std::vector<std::shared_ptr<Node>>& leaves,
                  const variable_list& results) {
    using torch::autograd::AccumulateGrad;
    at::NoGradGuard no_grad;  // the rule steals only without grad mode
    std::vector<std::pair<size_t, variable_list>> hooked;
    for (size_t i = 0; i < leaves.size(); ++i) {
      auto* node = static_cast<AccumulateGrad*>(leaves[i].get());
      if (!results[i].defined()) continue;
      // Hooks run outside the lock: a Python hook takes the GIL.
      variable_list grad{results[i]};
      for (const auto& hook : node->pre_hooks()) grad = (*hook)(grad);
      grad[0] = AccumulateGrad::callHooks(node->variable, std::move(grad[0]));
      if (grad[0].defined()) {
        absl::MutexLock lock(&record.mu);
        const at::Tensor& leaf = node->variable;
        auto [it, fresh] = record.grad_index.emplace(
            leaf.unsafeGetTensorImpl(), record.grads.size());
        if (fresh) record.grads.emplace_back(leaf, at::Tensor());
        at::Tensor& sum = record.grads[it->second].second;
        // Two references: `grad`'s and `results`'.
        AccumulateGrad::accumulateGrad(
            leaf, sum, grad[0], /*num_expected_refs=*/2,
            [&sum](at::Tensor&& update) { sum = std::move(update); });
      }
      if (!node->post_hooks().empty()) hooked.emplace_back(i, std::move(grad));
    }
    if (hooked.empty()) return;
    struct Lent {
      at::Tensor leaf;
      at::Tensor own;  // the leaf's .grad before
    };
    std::vector<Lent> lent;
    run_in_graph_task([&] {
      for (const auto& [i, grad] : hooked) {
        auto* node = static_cast<AccumulateGrad*>(leaves[i].get());
        at::Tensor leaf = node->variable;
        at::Tensor sum = context_grad(record, leaf);
        lent.push_back({leaf, leaf.grad()});
        leaf.mutable_grad() = sum.defined() ? sum.clone() : sum;
        for (const auto& hook : node->post_hooks()) (*hook)({}, grad);
      }
    });
    for (Lent& each : lent) {
      at::Tensor after = each.leaf.grad();
      each.leaf.mutable_grad() = each.own;
      if (!after.defined()) continue;
      absl::MutexLock lock(&record.mu);
      auto it = record.grad_index.find(each.leaf.unsafeGetTensorImpl());
      if (it != record.grad_index.end()) {
        record.grads[it->second].second = std::move(after);
      }
    }
  }

  static at::Tensor context_grad(ContextRecord& record,
                                 const at::Tensor& leaf) {
    absl::MutexLock lock(&record.mu);
    auto it = record.grad_index.find(leaf.unsafeGetTensorImpl());
    return it == record.grad_index.end() ? at::Tensor()
                                         : record.grads[it->second].second;
  }

  // Runs `fn` as the one node of a graph task of LibTorch's engine, on
  // this thread (a CPU graph task runs on its caller), so that what it
  // calls may queue final callbacks; they have run when this returns.
  static void run_in_graph_task(std::function<void()> fn) {
    struct Run : Node {
      explicit Run(std::function<void()> fn) : fn(std::move(fn)) {}
      variable_list apply(variable_list&&) override {
        fn();
        return {};
      }
      std::function<void()> fn;
    };
    auto node = std::make_shared<Run>(std::move(fn));
    at::Tensor seed = at::zeros({});
    node->add_input_metadata(seed);
    torch::autograd::Engine::get_default_engine().execute(
        {Edge(node, 0)}, {seed}, /*keep_graph=*/false,
        /*create_graph=*/false, /*accumulate_grad=*/true, {});
  }

  // Ships the gradients of `recv` to the worker that sent its tensors; runs
  // the passes for what its response returns. The future completes when
  // all of that is done, with what those passes have for `requester`.
  Future<Returned> send_backward(const PassScope& scope, const RecvNode& recv,
                                 c10::List<at::Tensor> grads) {
    Future<Returned> done = Future<Returned>::ready(
        absl::CancelledError("the worker is shut down"));
    with_worker([&](Worker& worker) {
      absl::StatusOr<WorkerInfo> to = worker.get_worker_info(To(recv.from()));
      if (!to.ok()) {
        done = Future<Returned>::ready(to.status());
        return;
      }
      Message request;
      request.type = kAutogradBackward;
      absl::Status encoded = worker.encode(
          c10::ivalue::Tuple::create(
              {c10::IValue(recv.context()), c10::IValue(recv.message()),
               c10::IValue(scope.retain_graph),
               c10::IValue(std::move(grads))}),
          request);
      if (!encoded.ok()) {
        done = Future<Returned>::ready(encoded);
        return;
      }
      const std::string from = describe(self_);
      const std::string peer = describe(*to);
      std::shared_ptr<AutogradState> self = shared_from_this();
      Promise<Returned> promise;
      done = promise.future();
      worker.send(*to, std::move(request))
          .on_complete([self, scope, from, peer,
                        promise](const absl::StatusOr<Message>& response) {
            absl::StatusOr<std::vector<ReturnedGrads>> returned =
                response.ok() ? self->decode_returned(*response, peer)
                              : response.status();
            if (!returned.ok()) {
              // A remote pass's own report names its worker already.
              if (absl::StrContains(returned.status().message(),
                                    "Error on worker")) {
                promise.set(returned.status());
              } else {
                promise.set(absl::Status(
                    returned.status().code(),
                    absl::StrCat("Error on worker ", from,
                                 ": sending gradients to worker ", peer,
                                 " failed: ", returned.status().message())));
              }
              return;
            }
            if (returned->empty()) {
              promise.set(Returned());
              return;
            }
            self->run_returned(scope, *std::move(returned))
                .on_complete([promise](const absl::StatusOr<Returned>& r) {
                  promise.set(r);
                });
          });
    });
    return done;
  }

  // The gradients a BACKWARD's response from `peer` returned: none for an
  // ACK; an AUTOGRAD_BACKWARD_RET carries (message ids, how many gradients
  // each, the gradients) = (int[], int[], Tensor[]).
  absl::StatusOr<std::vector<ReturnedGrads>> decode_returned(
      const Message& response, const std::string& peer) {
    std::vector<ReturnedGrads> out;
    if (response.type != kAutogradBackwardRet) return out;
    absl::StatusOr<c10::IValue> payload = absl::CancelledError("shut down");
    with_worker([&](Worker& w) { payload = w.decode(response); });
    if (!payload.ok()) return payload.status();
    const auto malformed = [&peer]() {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed AUTOGRAD_BACKWARD_RET from worker ", peer,
          ": expected (int[] messages, int[] counts, Tensor[] gradients) "
          "with one count per message and as many gradients as counted"));
    };
    if (!payload->isTuple() || payload->toTupleRef().elements().size() != 3) {
      return malformed();
    }
    const auto& parts = payload->toTupleRef().elements();
    if (!parts[0].isIntList() || !parts[1].isIntList() ||
        !parts[2].isTensorList()) {
      return malformed();
    }
    const std::vector<int64_t> messages = parts[0].toIntVector();
    const std::vector<int64_t> counts = parts[1].toIntVector();
    const std::vector<at::Tensor> grads = parts[2].toTensorVector();
    if (messages.size() != counts.size()) return malformed();
    size_t next = 0;
    for (size_t i = 0; i < messages.size(); ++i) {
      if (counts[i] < 0 ||
          static_cast<uint64_t>(counts[i]) > grads.size() - next) {
        return malformed();
      }
      c10::List<at::Tensor> these;
      for (int64_t k = 0; k < counts[i]; ++k) these.push_back(grads[next++]);
      out.push_back({messages[i], std::move(these)});
    }
    if (next != grads.size()) return malformed();
    return out;
  }

  // BACKWARD: (context, message, retain_graph, grads) for a send node here.
  // The response returns the gradients the passes have for the sender's
  // recv nodes (AUTOGRAD_BACKWARD_RET), or is an ACK.
  Future<Message> on_backward(Message request) {
    absl::StatusOr<c10::IValue> payload = absl::CancelledError("shut down");
    with_worker([&](Worker& w) { payload = w.decode(request); });
    if (!payload.ok()) return Future<Message>::ready(payload.status());
    if (!payload->isTuple() || payload->toTupleRef().elements().size() != 4 ||
        !payload->toTupleRef().elements()[0].isInt() ||
        !payload->toTupleRef().elements()[1].isInt() ||
        !payload->toTupleRef().elements()[2].isBool() ||
        !payload->toTupleRef().elements()[3].isTensorList()) {
      return Future<Message>::ready(absl::InvalidArgumentError(absl::StrCat(
          "Error on worker ", describe(self_),
          ": malformed BACKWARD: expected (int, int, bool, Tensor[])")));
    }
    const auto& parts = payload->toTupleRef().elements();
    const int64_t context = parts[0].toInt();
    std::shared_ptr<ContextRecord> record = find(context);
    if (record == nullptr) {
      return Future<Message>::ready(unknown_context(context));
    }
    std::weak_ptr<AutogradState> weak = weak_from_this();
    PassScope scope{record, parts[2].toBool(), kFromSendNode, nullptr};
    return pass_from_send(scope, parts[1].toInt(), parts[3].toTensorVector())
        .then([weak](const absl::StatusOr<Returned>& done)
                  -> absl::StatusOr<Message> {
          if (!done.ok()) return done.status();
          if (done->empty()) return ack();
          std::shared_ptr<AutogradState> self = weak.lock();
          if (self == nullptr) return absl::CancelledError("shut down");
          return self->encode_returned(*done);
        });
  }

  absl::StatusOr<Message> encode_returned(const Returned& returned) {
    c10::List<int64_t> messages;
    c10::List<int64_t> counts;
    c10::List<at::Tensor> grads;
    for (const ReturnedGrads& entry : returned) {
      messages.push_back(entry.message);
      counts.push_back(static_cast<int64_t>(entry.grads.size()));
      for (size_t k = 0; k < entry.grads.size(); ++k) {
        grads.push_back(entry.grads.get(k));
      }
    }
    Message response;
    response.type = kAutogradBackwardRet;
    absl::Status encoded = absl::CancelledError("the worker is shut down");
    with_worker([&](Worker& worker) {
      encoded = worker.encode(
          c10::ivalue::Tuple::create({c10::IValue(std::move(messages)),
                                      c10::IValue(std::move(counts)),
                                      c10::IValue(std::move(grads))}),
          response);
    });
    if (!encoded.ok()) return encoded;
    return response;
  }

  // ---- cleanup

  // Forgets `id` here and tells the workers it exchanged messages with
  // (except `from`), who do the same; completes when they answered.
  Future<bool> cleanup(int64_t id, int32_t from) {
    std::shared_ptr<ContextRecord> record;
    {
      absl::MutexLock lock(&mu_);
      auto it = contexts_.find(id);
      if (it == contexts_.end()) return Future<bool>::ready(true);
      record = std::move(it->second);
      contexts_.erase(it);
    }
    std::vector<int32_t> peers;
    {
      absl::MutexLock lock(&record->mu);
      peers.assign(record->peers.begin(), record->peers.end());
    }
    record.reset();  // the graph this context kept alive goes now
    std::vector<Future<bool>> sent;
    with_worker([&](Worker& worker) {
      for (int32_t peer : peers) {
        if (peer == from) continue;
        absl::StatusOr<WorkerInfo> to = worker.get_worker_info(To(peer));
        if (!to.ok()) continue;
        Message request;
        request.type = kAutogradCleanup;
        absl::Status encoded = worker.encode(
            c10::ivalue::Tuple::create(
                {c10::IValue(id), c10::IValue(int64_t{self_.id})}),
            request);
        if (!encoded.ok()) continue;
        sent.push_back(worker.send(*to, std::move(request))
                           .then([](const absl::StatusOr<Message>& response)
                                     -> absl::StatusOr<bool> {
                             if (!response.ok()) return response.status();
                             return true;
                           }));
      }
    });
    return all_of(sent);
  }

  // A Context was left: forgets it here at once and releases it on its
  // peers without waiting (each send is bounded by the RPC timeout).
  // await_releases() waits for the releases in flight.
  void release(int64_t id) {
    {
      absl::MutexLock lock(&releases_mu_);
      ++releases_in_flight_;
    }
    std::weak_ptr<AutogradState> weak = weak_from_this();
    cleanup(id, -1).on_complete([weak, id](const absl::StatusOr<bool>& done) {
      if (!done.ok()) {
        LOG(WARNING) << "releasing distributed autograd context " << id
                     << " on every worker: " << done.status();
      }
      if (std::shared_ptr<AutogradState> self = weak.lock()) {
        absl::MutexLock lock(&self->releases_mu_);
        --self->releases_in_flight_;
      }
    });
  }

  absl::Status await_releases(absl::Time deadline) {
    absl::MutexLock lock(&releases_mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(releases_mu_) {
      return releases_in_flight_ == 0;
    };
    if (releases_mu_.AwaitWithDeadline(absl::Condition(&none), deadline)) {
      return absl::OkStatus();
    }
    return absl::DeadlineExceededError(absl::StrCat(
        releases_in_flight_, " release",
        releases_in_flight_ == 1 ? "" : "s",
        " of distributed autograd contexts still in flight on worker ",
        describe(self_)));
  }

  Future<Message> on_cleanup(Message request) {
    absl::StatusOr<c10::IValue> payload = absl::CancelledError("shut down");
    with_worker([&](Worker& w) { payload = w.decode(request); });
    if (!payload.ok()) return Future<Message>::ready(payload.status());
    if (!payload->isTuple() || payload->toTupleRef().elements().size() != 2 ||
        !payload->toTupleRef().elements()[0].isInt() ||
        !payload->toTupleRef().elements()[1].isInt()) {
      return Future<Message>::ready(absl::InvalidArgumentError(
          "malformed AUTOGRAD_CLEANUP: expected (int, int)"));
    }
    const auto& parts = payload->toTupleRef().elements();
    return cleanup(parts[0].toInt(), static_cast<int32_t>(parts[1].toInt()))
        .then([](const absl::StatusOr<bool>& done) -> absl::StatusOr<Message> {
          // Peers that are gone cannot hold the context any more.
          if (!done.ok()) VLOG(1) << "autograd cleanup: " << done.status();
          return ack();
        });
  }

  absl::StatusOr<ContextNodes> nodes(int64_t id) {
    std::shared_ptr<ContextRecord> record = find(id);
    if (record == nullptr) return unknown_context(id);
    ContextNodes out;
    absl::MutexLock lock(&record->mu);
    for (const auto& [message, send] : record->sends) out.sends[message] = send;
    for (const auto& [message, recv] : record->recvs) out.recvs[message] = recv;
    return out;
  }

  absl::StatusOr<std::vector<int32_t>> peers(int64_t id) {
    std::shared_ptr<ContextRecord> record = find(id);
    if (record == nullptr) return unknown_context(id);
    absl::MutexLock lock(&record->mu);
    std::vector<int32_t> out(record->peers.begin(), record->peers.end());
    std::sort(out.begin(), out.end());
    return out;
  }

  absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> gradients(int64_t id) {
    std::shared_ptr<ContextRecord> record = find(id);
    if (record == nullptr) return unknown_context(id);
    c10::Dict<at::Tensor, at::Tensor> out;
    absl::MutexLock lock(&record->mu);
    for (const auto& [leaf, grad] : record->grads) out.insert(leaf, grad);
    return out;
  }

 private:
  absl::Mutex mu_;
  Worker* worker_ ABSL_GUARDED_BY(mu_);
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
  const WorkerInfo self_;
  std::atomic<int64_t> next_context_{0};
  // Shared with the callbacks that end a pass, which may outlive this.
  std::shared_ptr<std::atomic<int64_t>> passes_ =
      std::make_shared<std::atomic<int64_t>>(0);
  std::atomic<int64_t> next_message_{0};
  absl::Mutex releases_mu_;
  int64_t releases_in_flight_ ABSL_GUARDED_BY(releases_mu_) = 0;
  absl::flat_hash_map<int64_t, std::shared_ptr<ContextRecord>> contexts_
      ABSL_GUARDED_BY(mu_);
};

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
