// The distributed backward pass: engine passes on LibTorch's engine from
// roots and send functions, gradients accumulated in the context, and the
// BACKWARD messages that carry gradients to other workers.

#include "autograd/internal/state.h"

#include <ATen/Parallel.h>
#include <ATen/Parallel.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include "autograd/messages.h"

namespace tether::autograd::internal {

namespace {

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

}  // namespace

Future<Returned> AutogradState::pass(const PassScope& scope,
                                     const edge_list& roots,
                                     const variable_list& grads) {
  const int64_t context = scope.record->id;
  {
    absl::MutexLock lock(&passes_->mu);
    ++passes_->by_context[context];
  }
  Future<Returned> done = run_pass(scope, roots, grads);
  done.on_complete(
      [passes = passes_, context](const absl::StatusOr<Returned>&) {
        absl::MutexLock lock(&passes->mu);
        auto it = passes->by_context.find(context);
        if (--it->second == 0) passes->by_context.erase(it);
      });
  return done;
}

int64_t AutogradState::backward_passes() const {
  absl::MutexLock lock(&passes_->mu);
  return static_cast<int64_t>(passes_->by_context.size());
}

Future<Returned> AutogradState::run_pass(const PassScope& scope,
                                         const edge_list& roots,
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

Future<Returned> AutogradState::pass_from_send(
    const PassScope& scope, int64_t message, std::vector<at::Tensor> incoming) {
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

Future<Returned> AutogradState::run_returned(
    const PassScope& scope, std::vector<ReturnedGrads> returned) {
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

void AutogradState::accumulate(ContextRecord& record,
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

at::Tensor AutogradState::context_grad(ContextRecord& record,
                                       const at::Tensor& leaf) {
  absl::MutexLock lock(&record.mu);
  auto it = record.grad_index.find(leaf.unsafeGetTensorImpl());
  return it == record.grad_index.end() ? at::Tensor()
                                       : record.grads[it->second].second;
}

void AutogradState::run_in_graph_task(std::function<void()> fn) {
  struct Run : Node {
    explicit Run(std::function<void()> fn) : fn(std::move(fn)) {}
    variable_list apply(variable_list&&) {
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

Future<Returned> AutogradState::send_backward(const PassScope& scope,
                                              const RecvNode& recv,
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

absl::StatusOr<std::vector<ReturnedGrads>> AutogradState::decode_returned(
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

Future<Message> AutogradState::on_backward(Message request) {
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

absl::StatusOr<Message> AutogradState::encode_returned(
    const Returned& returned) {
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

}  // namespace tether::autograd::internal
