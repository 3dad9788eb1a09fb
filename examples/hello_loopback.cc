// A first tether program: three workers in one process over the loopback
// backend. The "driver" pushes a batch through a two-stage pipeline whose
// stages run on the other workers (a builtin operator on "stage1", a
// TorchScript function compiled on "stage2"), then checks the result against
// the same computation done locally. The smallest program to start from;
// the README's main job is the model-parallel training of examples/train.cc.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>

#include <cstdio>
#include <thread>
#include <vector>

#include "backends/builtin.h"
#include "core/worker.h"

namespace {

constexpr char kStage2[] = R"(
def stage2(h: Tensor, bias: Tensor) -> Tensor:
    return torch.relu(h + bias).sum(dim=1)
)";

int run() {
  tether::BackendRegistry registry;
  if (absl::Status s = tether::backends::register_builtin_backends(registry);
      !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  tether::RpcOptions options;
  options.backend = "loopback";
  options.init_method = "memory://hello";
  options.num_worker_threads = 2;

  const std::vector<std::string> names = {"driver", "stage1", "stage2"};
  std::vector<std::unique_ptr<tether::Worker>> workers(names.size());
  std::vector<absl::Status> errors(names.size());
  std::vector<std::thread> threads;
  for (size_t rank = 0; rank < names.size(); ++rank) {
    threads.emplace_back([&, rank] {
      auto worker = tether::Worker::create(names[rank], static_cast<int>(rank),
                                           names.size(), options, registry);
      if (worker.ok()) {
        workers[rank] = std::move(*worker);
      } else {
        errors[rank] = worker.status();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const absl::Status& error : errors) {
    if (!error.ok()) {
      std::fprintf(stderr, "init failed: %s\n", error.ToString().c_str());
      return 1;
    }
  }
  if (absl::Status s = workers[2]->register_script(kStage2); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }

  at::manual_seed(0);
  at::Tensor x = at::randn({8, 16});
  at::Tensor w = at::randn({16, 4});
  at::Tensor bias = at::randn({4});
  tether::Worker& driver = *workers[0];
  absl::StatusOr<c10::IValue> h = driver.rpc_sync("stage1", "aten::mm", {x, w});
  if (!h.ok()) {
    std::fprintf(stderr, "stage1: %s\n", h.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<c10::IValue> y =
      driver.rpc_sync("stage2", "stage2", {h->toTensor(), bias});
  if (!y.ok()) {
    std::fprintf(stderr, "stage2: %s\n", y.status().ToString().c_str());
    return 1;
  }
  at::Tensor expected = at::relu(at::mm(x, w) + bias).sum(1);
  bool same = at::allclose(y->toTensor(), expected);
  std::printf("pipeline output (%s): %s\n", same ? "matches local" : "MISMATCH",
              absl::StrCat(y->toTensor().sizes()[0], " values").c_str());
  for (int64_t i = 0; i < y->toTensor().size(0); ++i) {
    std::printf("  %8.4f\n", y->toTensor()[i].item<float>());
  }

  threads.clear();
  for (auto& worker : workers) {
    threads.emplace_back([&worker, &errors] {
      absl::Status s = worker->shutdown();
      if (!s.ok()) std::fprintf(stderr, "shutdown: %s\n", s.ToString().c_str());
    });
  }
  for (auto& thread : threads) thread.join();
  return same ? 0 : 1;
}

}  // namespace

int main() { return run(); }
