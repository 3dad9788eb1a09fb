// The peer's third seed program (examples/python/split_model_seed.py) in
// C++: a model split across two workers, each part a torch::nn::Module
// created there, trained by the master with distributed autograd and a
// DistributedOptimizer. Run: tether_run --nproc 3 -- split_model_seed (the
// backend is TETHER_BACKEND's, default tensorpipe).
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>

#include "tether/tether.h"

namespace dist_autograd = tether::autograd;
using tether::RemoteModule;

// One part of the model; it lives on the worker that created it.
struct StageImpl : torch::nn::Module {
  StageImpl(int64_t in_features, int64_t out_features, bool activation)
      : activation(activation) {
    at::manual_seed(in_features);
    linear = register_module("linear", torch::nn::Linear(in_features,
                                                         out_features));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = linear(x);
    return activation ? at::relu(y) : y;
  }
  torch::nn::Linear linear{nullptr};
  bool activation;
};

absl::Status train(int steps) {
  at::manual_seed(0);
  at::Tensor x = at::randn({64, 4});
  at::Tensor y = at::matmul(x, at::tensor({1.0f, -2.0f, 0.5f, 3.0f})
                                   .reshape({4, 1})) + 0.1;
  // stage1 lives on worker1, stage2 on worker2.
  TETHER_ASSIGN_OR_RETURN(RemoteModule stage1, RemoteModule::create<StageImpl>(
                                                   "worker1", {4, 16, true}));
  TETHER_ASSIGN_OR_RETURN(RemoteModule stage2, RemoteModule::create<StageImpl>(
                                                   "worker2", {16, 1, false}));
  TETHER_ASSIGN_OR_RETURN(std::vector<tether::RRef> params,
                          stage1.parameter_rrefs());
  TETHER_ASSIGN_OR_RETURN(std::vector<tether::RRef> params2,
                          stage2.parameter_rrefs());
  params.insert(params.end(), params2.begin(), params2.end());
  tether::optim::Options sgd;
  sgd.lr = 0.05;
  TETHER_ASSIGN_OR_RETURN(tether::optim::DistributedOptimizer dist_optim,
                          tether::optim::DistributedOptimizer::create(
                              tether::optim::Kind::kSGD, params, sgd));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    TETHER_ASSIGN_OR_RETURN(dist_autograd::Context context,
                            dist_autograd::Context::enter());
    TETHER_ASSIGN_OR_RETURN(at::Tensor h, stage1.forward<at::Tensor>({x}));
    TETHER_ASSIGN_OR_RETURN(at::Tensor out, stage2.forward<at::Tensor>({h}));
    at::Tensor loss = at::mse_loss(out, y);
    TETHER_RETURN_IF_ERROR(dist_autograd::backward(context.id(), {loss}));
    TETHER_RETURN_IF_ERROR(dist_optim.step(context.id()));
    losses.push_back(loss.item<double>());
    std::printf("step %d loss %.4f\n", step, losses.back());
  }
  std::printf("loss fell from %.4f to %.4f\n", losses.front(), losses.back());
  if (!(losses.back() < losses.front() / 2)) {
    return absl::InternalError("the loss did not fall by half");
  }
  return absl::OkStatus();
}

absl::Status run_worker(int rank) {
  TETHER_RETURN_IF_ERROR((tether::register_module<StageImpl, int64_t, int64_t,
                                                  bool>()));
  if (rank == 0) {
    TETHER_RETURN_IF_ERROR(tether::init_rpc("master"));
    TETHER_RETURN_IF_ERROR(train(30));
  } else {
    TETHER_RETURN_IF_ERROR(tether::init_rpc(absl::StrCat("worker", rank)));
  }
  return tether::shutdown();
}

int main() { return tether::run_main(run_worker); }
