#include "tools/internal/workloads.h"

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <time.h>

#include <deque>
#include <tuple>
#include <utility>

#include "autograd/autograd.h"

namespace tether::bench {
namespace {

at::Tensor identity(const at::Tensor& x) { return x; }

double cpu_seconds() { return process_cpu_seconds(); }

std::pair<at::Tensor, at::Tensor> linear_parameters(int64_t in, int64_t out,
                                                    int64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return {at::randn({out, in}, gen).div_(16).requires_grad_(true),
          at::zeros({out}).requires_grad_(true)};
}

struct Linear : torch::CustomClassHolder {
  Linear(int64_t in, int64_t out, int64_t seed) {
    std::tie(weight, bias) = linear_parameters(in, out, seed);
  }
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight, bias); }

  at::Tensor weight;
  at::Tensor bias;
};

TORCH_LIBRARY(tether_bench, m) {
  m.def("identity(Tensor x) -> Tensor", &identity);
  m.def("cpu_seconds() -> float", &cpu_seconds);
  m.class_<Linear>("Linear")
      .def(torch::init<int64_t, int64_t, int64_t>())
      .def("forward", &Linear::forward);
}

constexpr char kAdd[] = "aten::add.Scalar";
constexpr char kCpuSeconds[] = "tether_bench::cpu_seconds";

}  // namespace

at::Tensor small_tensor() { return at::ones({2}); }

absl::Status add_sync(Worker& worker, const To& to, const at::Tensor& x) {
  return worker.rpc_sync(to, kAdd, {x, 1.0}).status();
}

absl::Status add_async_window(Worker& worker, const To& to,
                              const at::Tensor& x, int calls, int window) {
  std::deque<Future<c10::IValue>> in_flight;
  absl::Status first_error;
  auto wait_oldest = [&]() {
    absl::StatusOr<c10::IValue> r = in_flight.front().get();
    in_flight.pop_front();
    if (!r.ok() && first_error.ok()) first_error = r.status();
  };
  for (int i = 0; i < calls; ++i) {
    if (static_cast<int>(in_flight.size()) == window) wait_oldest();
    in_flight.push_back(worker.rpc_async(to, kAdd, {x, 1.0}));
  }
  while (!in_flight.empty()) wait_oldest();
  return first_error;
}

absl::Status add_remote_to_here(Worker& worker, const To& to,
                                const at::Tensor& x) {
  absl::StatusOr<RRef> r = remote(worker, to, kAdd, {x, 1.0});
  if (!r.ok()) return r.status();
  return r->to_here().status();
}

double process_cpu_seconds() {
  timespec t{};
  // Cannot fail for this clock on Linux.
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

absl::StatusOr<double> cpu_seconds_of(Worker& worker, const To& to) {
  absl::StatusOr<c10::IValue> r = worker.rpc_sync(to, kCpuSeconds, {});
  if (!r.ok()) return r.status();
  if (!r->isDouble()) {
    return absl::InternalError(absl::StrCat("cpu_seconds returned a ", r->tagKind()));
  }
  return r->toDouble();
}

absl::Status CpuUse::start() {
  absl::StatusOr<double> peer = cpu_seconds_of(worker_, to_);
  if (!peer.ok()) return peer.status();
  peer_ = *peer;
  self_ = process_cpu_seconds();
  return absl::OkStatus();
}

absl::StatusOr<std::pair<double, double>> CpuUse::seconds() {
  const double self = process_cpu_seconds() - self_;
  absl::StatusOr<double> peer = cpu_seconds_of(worker_, to_);
  if (!peer.ok()) return peer.status();
  return std::make_pair(self, *peer - peer_);
}

at::Tensor payload_of(int64_t bytes) {
  return at::ones({bytes}, at::TensorOptions().dtype(at::kByte));
}

absl::Status echo(Worker& worker, const To& to, const at::Tensor& payload) {
  absl::StatusOr<c10::IValue> back = worker.rpc_sync(to, kIdentity, {payload});
  if (!back.ok()) return back.status();
  if (!back->isTensor() || back->toTensor().numel() != payload.numel()) {
    return absl::InternalError("echo: the tensor came back changed");
  }
  return absl::OkStatus();
}

absl::StatusOr<RRef> make_linear(Worker& worker, const To& to) {
  return remote(worker, to, kLinear,
                {kLinearFeatures, kLinearFeatures, int64_t{1}});
}

at::Tensor linear_input() {
  at::Generator gen = at::detail::createCPUGenerator(2);
  return at::randn({kLinearBatch, kLinearFeatures}, gen).requires_grad_(true);
}

absl::Status autograd_step(Worker& worker, const RRef& linear,
                           const at::Tensor& input) {
  absl::StatusOr<autograd::Context> context = autograd::Context::enter(worker);
  if (!context.ok()) return context.status();
  absl::StatusOr<c10::IValue> y = linear.rpc_sync().call("forward", {input});
  if (!y.ok()) return y.status();
  if (absl::Status s =
          autograd::backward(worker, context->id(), {y->toTensor().sum()});
      !s.ok()) {
    return s;
  }
  absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> grads =
      autograd::get_gradients(worker, context->id());
  if (!grads.ok()) return grads.status();
  if (grads->find(input) == grads->end()) {
    return absl::InternalError(
        absl::StrCat("autograd step: no gradient for the input among ",
                     grads->size()));
  }
  return absl::OkStatus();  // the context is released on the way out
}

LocalLinear::LocalLinear() {
  std::tie(weight_, bias_) =
      linear_parameters(kLinearFeatures, kLinearFeatures, 1);
}

void LocalLinear::step(const at::Tensor& input) {
  at::linear(input, weight_, bias_).sum().backward();
}

}  // namespace tether::bench
