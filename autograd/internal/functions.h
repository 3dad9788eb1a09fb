// The send and recv functions of distributed autograd: the two halves of
// an autograd message pair, nodes of LibTorch's graph (PyTorch's
// SendRpcBackward and RecvRpcBackward). Private to //autograd.
#ifndef TETHER_AUTOGRAD_INTERNAL_FUNCTIONS_H_
#define TETHER_AUTOGRAD_INTERNAL_FUNCTIONS_H_

#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <string>
#include <utility>

namespace tether::autograd::internal {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

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

}  // namespace tether::autograd::internal

#endif  // TETHER_AUTOGRAD_INTERNAL_FUNCTIONS_H_
