#include "autograd/autograd_testing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <chrono>
#include <thread>

#include "autograd/autograd.h"
#include "core/rpc.h"
#include "rref/rref.h"
#include "rref/rref_testing.h"

namespace tether::testing {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FailBackward : torch::autograd::Function<FailBackward> {
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& x) {
    return x * 1;
  }
  static variable_list backward(AutogradContext* /*ctx*/,
                                variable_list /*grads*/) {
    TORCH_CHECK(false, "injected failure in backward");
  }
};

struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            int64_t millis) {
    ctx->saved_data["ms"] = millis;
    return x * 1;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(ctx->saved_data["ms"].toInt()));
    return {grads[0], at::Tensor()};
  }
};

at::Tensor fail_backward(const at::Tensor& x) { return FailBackward::apply(x); }

at::Tensor slow_backward(const at::Tensor& x, int64_t millis) {
  return SlowBackward::apply(x, millis);
}

std::tuple<at::Tensor, at::Tensor> two_outputs(const at::Tensor& a,
                                               const at::Tensor& b) {
  return {a * b, at::sin(a)};
}

at::Tensor mul_via(const std::string& to, const at::Tensor& a,
                   const at::Tensor& b) {
  absl::StatusOr<c10::IValue> product =
      rpc_sync(to, "aten::mul.Tensor", {a * 2, b});
  TORCH_CHECK(product.ok(), "onward call failed: ", product.status().ToString());
  return product->toTensor() + a;
}

int64_t live_contexts() {
  Worker* worker = Worker::serving();
  TORCH_CHECK(worker != nullptr, "live_contexts must run as an RPC");
  absl::StatusOr<int64_t> n = autograd::live_contexts(*worker);
  TORCH_CHECK(n.ok(), n.status().ToString());
  return *n;
}

struct Linear : torch::CustomClassHolder {
  Linear(int64_t in, int64_t out, int64_t seed) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    weight = at::randn({out, in}, gen).requires_grad_(true);
    bias = at::randn({out}, gen).requires_grad_(true);
  }

  at::Tensor forward(const at::Tensor& x) {
    return at::addmm(bias, x, weight.t());
  }

  std::vector<at::Tensor> parameters() {
    return {weight.detach().clone(), bias.detach().clone()};
  }

  std::vector<at::Tensor> grads(int64_t context) {
    Worker* worker = Worker::serving();
    TORCH_CHECK(worker != nullptr, "grads must run as an RPC");
    absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> all =
        autograd::get_gradients(*worker, context);
    TORCH_CHECK(all.ok(), all.status().ToString());
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : {weight, bias}) {
      auto it = all->find(p);
      out.push_back(it == all->end() ? at::zeros_like(p).detach()
                                     : it->value().detach().clone());
    }
    return out;
  }

  at::Tensor weight;
  at::Tensor bias;
};

}  // namespace

TORCH_LIBRARY(tether_autograd_testing, m) {
  m.def("fail_backward(Tensor x) -> Tensor", &fail_backward);
  m.def("slow_backward(Tensor x, int ms) -> Tensor", &slow_backward);
  m.def("two_outputs(Tensor a, Tensor b) -> (Tensor, Tensor)", &two_outputs);
  m.def("mul_via(str to, Tensor a, Tensor b) -> Tensor", &mul_via);
  m.def("live_contexts() -> int", &live_contexts);
  m.class_<Linear>("Linear")
      .def(torch::init<int64_t, int64_t, int64_t>())
      .def("forward", &Linear::forward)
      .def("parameters", &Linear::parameters)
      .def("grads", &Linear::grads);
}

std::vector<std::unique_ptr<Worker>> start_autograd_workers(
    const BackendRegistry& registry, const RpcOptions& options,
    const std::vector<std::string>& names) {
  return start_workers(registry, options, names, RRefOptions(),
                       {autograd::autograd_extension()});
}

}  // namespace tether::testing
