#include "autograd/autograd.h"

#include <ATen/ATen.h>
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

#include <atomic>
#include <memory>
#include <string>
#include <utility>

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
  std::string name() const override {
    return absl::StrCat("tether::autograd::SendBackward(to worker ", to_, ")");
  }

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
    return absl::StrCat("tether::autograd::RecvBackward(from worker ", from_,
                        ")");
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
  // Workers this context exchanged messages with: cleanup reaches them.
  absl::flat_hash_set<int32_t> peers ABSL_GUARDED_BY(mu);
  // Leaf -> gradient, in the order leaves first got one.
  std::vector<std::pair<at::Tensor, at::Tensor>> grads ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<const c10::TensorImpl*, size_t> grad_index
      ABSL_GUARDED_BY(mu);
  // Engine passes of this context on this worker run one at a time.
  absl::Mutex engine_mu;
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
class AutogradState final : public AutogradHook,
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

  // ---- AutogradHook

  int64_t current_context() const override { return thread_context; }

  int64_t exchange_current_context(int64_t context) override {
    return std::exchange(thread_context, context);
  }

  absl::StatusOr<wire::AutogradMeta> on_send(
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
    wire::AutogradMeta meta;
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
      meta.message_id = next_message_.fetch_add(1);
      record->sends.emplace(meta.message_id,
                            std::make_shared<SendNode>(std::move(edges), to.id));
    }
    return meta;
  }

  absl::Status on_receive(const wire::AutogradMeta& meta,
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
    return absl::OkStatus();
  }

  // ---- backward

  // One engine pass on this worker from `roots` with `grads` (defined,
  // matching): leaf gradients accumulate in the context, gradients reaching
  // recv nodes go back to their senders. Completes when every BACKWARD
  // message it sent is done (first error wins).
  Future<bool> pass(const std::shared_ptr<ContextRecord>& record,
                    const edge_list& roots, const variable_list& grads,
                    bool retain_graph) {
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
    if (outputs.empty()) return Future<bool>::ready(true);

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
        return Future<bool>::ready(
            backward_failed(e.what_without_backtrace()));
      } catch (const std::exception& e) {
        return Future<bool>::ready(backward_failed(e.what()));
      }
    }
    accumulate(*record, leaves, results);
    std::vector<Future<bool>> sent;
    size_t next = leaves.size();
    for (const auto& recv : recvs) {
      c10::List<at::Tensor> recv_grads;
      bool any = false;
      for (uint32_t i = 0; i < recv->num_inputs(); ++i, ++next) {
        any = any || results[next].defined();
        recv_grads.push_back(results[next]);
      }
      if (any) {
        sent.push_back(send_backward(*recv, std::move(recv_grads),
                                     retain_graph));
      }
    }
    return all_of(sent);
  }

  // Adds the gradients this pass computed for `leaves` (the first of
  // `results`) to the context, as the peer's engine does: each leaf's
  // AccumulateGrad pre-hooks and tensor hooks change the gradient first,
  // its post-hooks see it after, and a gradient nothing else holds is kept
  // without a copy (AccumulateGrad's own rule; one that `results` holds for
  // another leaf too is copied, as the peer holds every result until all
  // are accumulated).
  void accumulate(ContextRecord& record,
                  const std::vector<std::shared_ptr<Node>>& leaves,
                  const variable_list& results) {
    using torch::autograd::AccumulateGrad;
    at::NoGradGuard no_grad;  // the rule steals only without grad mode
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
      for (const auto& hook : node->post_hooks()) (*hook)({}, grad);
    }
  }

  // Ships the gradients of `recv` to the worker that sent its tensors.
  Future<bool> send_backward(const RecvNode& recv, c10::List<at::Tensor> grads,
                             bool retain_graph) {
    Future<bool> done = Future<bool>::ready(
        absl::CancelledError("the worker is shut down"));
    with_worker([&](Worker& worker) {
      absl::StatusOr<WorkerInfo> to = worker.get_worker_info(To(recv.from()));
      if (!to.ok()) {
        done = Future<bool>::ready(to.status());
        return;
      }
      Message request;
      request.type = MessageType::kAutogradBackward;
      absl::Status encoded = worker.encode(
          c10::ivalue::Tuple::create(
              {c10::IValue(recv.context()), c10::IValue(recv.message()),
               c10::IValue(retain_graph), c10::IValue(std::move(grads))}),
          request);
      if (!encoded.ok()) {
        done = Future<bool>::ready(encoded);
        return;
      }
      const std::string from = describe(self_);
      const std::string peer = describe(*to);
      done = worker.send(*to, std::move(request))
                 .then([from, peer](const absl::StatusOr<Message>& response)
                           -> absl::StatusOr<bool> {
                   if (response.ok()) return true;
                   // A remote pass's own report names its worker already.
                   if (absl::StrContains(response.status().message(),
                                         "Error on worker")) {
                     return response.status();
                   }
                   return absl::Status(
                       response.status().code(),
                       absl::StrCat("Error on worker ", from,
                                    ": sending gradients to worker ", peer,
                                    " failed: ", response.status().message()));
                 });
    });
    return done;
  }

  // BACKWARD: (context, message, retain_graph, grads) for a send node here.
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
    const int64_t message = parts[1].toInt();
    std::shared_ptr<ContextRecord> record = find(context);
    if (record == nullptr) {
      return Future<Message>::ready(unknown_context(context));
    }
    std::shared_ptr<SendNode> send;
    {
      absl::MutexLock lock(&record->mu);
      auto it = record->sends.find(message);
      if (it != record->sends.end()) send = it->second;
    }
    if (send == nullptr) {
      return Future<Message>::ready(absl::NotFoundError(absl::StrCat(
          "Error on worker ", describe(self_), ": no autograd message ",
          message, " in context ", context)));
    }
    std::vector<at::Tensor> incoming = parts[3].toTensorVector();
    if (incoming.size() != send->next_edges().size()) {
      return Future<Message>::ready(absl::InvalidArgumentError(absl::StrCat(
          "Error on worker ", describe(self_), ": ", incoming.size(),
          " gradients for autograd message ", message, " which sent ",
          send->next_edges().size(), " tensors")));
    }
    edge_list roots;
    variable_list grads;
    for (size_t i = 0; i < incoming.size(); ++i) {
      if (!incoming[i].defined()) continue;
      roots.push_back(send->next_edges()[i]);
      grads.push_back(std::move(incoming[i]));
    }
    if (roots.empty()) return Future<Message>::ready(ack());
    return pass(record, roots, grads, parts[2].toBool())
        .then([](const absl::StatusOr<bool>& done) -> absl::StatusOr<Message> {
          if (!done.ok()) return done.status();
          return ack();
        });
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
        request.type = MessageType::kAutogradCleanup;
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
  std::atomic<int64_t> next_message_{0};
  absl::flat_hash_map<int64_t, std::shared_ptr<ContextRecord>> contexts_
      ABSL_GUARDED_BY(mu_);
};

namespace {

class AutogradExtension final : public WorkerExtension {
 public:
  explicit AutogradExtension(Worker& worker)
      : state_(std::make_shared<AutogradState>(worker)) {}
  ~AutogradExtension() override { state_->close(); }

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
        worker.register_handler(MessageType::kAutogradBackward,
                                route_to(weak, &AutogradState::on_backward));
    if (!added.ok()) return added;
    added = worker.register_handler(MessageType::kAutogradCleanup,
                                    route_to(weak, &AutogradState::on_cleanup));
    if (!added.ok()) return added;
    worker.set_autograd_hook(extension->state().get());
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
  absl::Duration bound = absl::Seconds(60);
  state->with_worker([&](Worker& worker) {
    bound = worker.resolve_timeout(kDefaultTimeout);
  });
  absl::StatusOr<bool> cleaned =
      state->cleanup(id, -1).get(absl::Now() + bound);
  if (!cleaned.ok()) {
    LOG(WARNING) << "releasing distributed autograd context " << id
                 << " on every worker: " << cleaned.status();
  }
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
  absl::StatusOr<bool> done =
      state->pass(record, edges, grads, retain_graph).get();
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

absl::StatusOr<int64_t> live_contexts(Worker& worker) {
  std::shared_ptr<AutogradState> state = internal::state_of(worker);
  if (state == nullptr) return no_extension(worker);
  return state->live();
}

}  // namespace tether::autograd
