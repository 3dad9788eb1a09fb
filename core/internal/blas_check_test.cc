#include "core/internal/blas_check.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tether::internal {
namespace {

// scripts/setup.sh installs a BLAS that is safe for concurrent calls; a
// process on the serial OpenBLAS is told so.
TEST(BlasCheck, ThisProcessesBlasIsSafeForConcurrentCalls) {
  std::optional<std::string> why = unsafe_blas();
  EXPECT_FALSE(why.has_value()) << *why;
}

// What a worker's handler pool does: matrix products on several threads at
// once, each checked against the same product computed alone. On Debian's
// serial OpenBLAS 0.3.21 a few of these 4,000 came out wrong in most runs.
TEST(BlasCheck, ConcurrentMatrixProductsGiveTheSerialResults) {
  constexpr int kThreads = 8;
  constexpr int kProducts = 4000;
  at::manual_seed(1000);
  const at::Tensor w = at::randn({256, 256}) / 16.0;
  const at::Tensor b = at::randn({256}) / 16.0;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < kProducts; ++i) {
    inputs.push_back(at::randn({64, 256}));
    expected.push_back(at::addmm(b, inputs.back(), w));
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kProducts; i += kThreads) {
        if (!at::equal(at::addmm(b, inputs[i], w), expected[i])) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0) << "of " << kProducts << " products";
}

}  // namespace
}  // namespace tether::internal
