// The main job's model trained across real processes, on the backend named
// by TETHER_TEST_BACKEND (set per cc_test in BUILD; TensorPipe by default):
// with one trainer every step's loss equals single-process LibTorch
// training; with two trainers sharing the parameter server both run to the
// end and learn.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "autograd/autograd.h"
#include "backends/builtin.h"
#include "core/rpc.h"
#include "examples/ps_model.h"
#include "testing/multiprocess.h"
#include "testing/status_matchers.h"

namespace tether::examples {
namespace {

using ::tether::testing::IsOk;

std::string backend_under_test() {
  const char* backend = std::getenv("TETHER_TEST_BACKEND");
  return backend != nullptr ? backend : "tensorpipe";
}

void init(int rank, int world) {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry;
    EXPECT_THAT(backends::register_builtin_backends(*r), IsOk());
    return r;
  }();
  RpcOptions options;
  options.backend = backend_under_test();
  options.init_method = "env://";
  ASSERT_THAT(init_rpc(rank == 0 ? "ps" : absl::StrCat("trainer", rank), rank,
                       world, options, *registry,
                       {rref_extension(), autograd::autograd_extension()}),
              IsOk());
}

std::vector<double> train(const ModelConfig& config, int rank, int64_t steps) {
  std::vector<double> losses;
  absl::StatusOr<Trainer> trainer = Trainer::create(config, "ps");
  EXPECT_THAT(trainer, IsOk());
  if (!trainer.ok()) return losses;
  DataStream data(config, rank);
  for (int64_t step = 1; step <= steps; ++step) {
    absl::StatusOr<double> loss = trainer->step(data.next());
    EXPECT_THAT(loss, IsOk()) << "step " << step;
    if (!loss.ok()) break;
    losses.push_back(*loss);
  }
  return losses;
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += v[i];
  return sum / static_cast<double>(to - from);
}

void expect_same_losses(optim::Kind kind, double lr) {
  ::tether::testing::run_in_processes(2, [kind, lr](int rank, int world) {
    init(rank, world);
    if (rank == 1) {
      ModelConfig config;
      config.optimizer = kind;
      config.lr = lr;
      constexpr int64_t kSteps = 60;
      std::vector<double> losses = train(config, rank, kSteps);
      std::vector<double> local = reference_losses(config, kSteps);
      ASSERT_EQ(losses.size(), local.size());
      for (size_t i = 0; i < losses.size(); ++i) {
        EXPECT_LE(std::abs(losses[i] - local[i]), 1e-5 * std::abs(local[i]))
            << "step " << i + 1 << ": distributed " << losses[i]
            << ", local " << local[i];
      }
      EXPECT_LT(mean(losses, 50, 60), mean(losses, 0, 10));
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

TEST(Training, OneTrainerMatchesLocalTrainingStepBySGD) {
  expect_same_losses(optim::Kind::kSGD, 0.5);
}

TEST(Training, OneTrainerMatchesLocalTrainingStepByAdam) {
  expect_same_losses(optim::Kind::kAdam, 0.01);
}

TEST(Training, TwoTrainersShareTheParameterServer) {
  ::tether::testing::run_in_processes(3, [](int rank, int world) {
    init(rank, world);
    if (rank > 0) {
      std::vector<double> losses = train(ModelConfig(), rank, 60);
      ASSERT_EQ(losses.size(), 60u);
      EXPECT_LT(mean(losses, 50, 60), mean(losses, 0, 10));
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

}  // namespace
}  // namespace tether::examples
