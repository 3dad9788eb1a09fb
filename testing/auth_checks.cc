#include "testing/auth_checks.h"

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "backends/builtin.h"
#include "core/auth/auth.h"
#include "core/worker.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr char kSecret[] = "the-group-secret-0123456789";
constexpr char kOtherSecret[] = "not-the-group-secret-98765";

// Workers "w0".. of one group, worker i with secrets[i] (empty: none).
std::vector<std::unique_ptr<Worker>> start(
    const std::string& backend, const BackendSettings& settings,
    const std::vector<std::string>& secrets) {
  static std::atomic<int> counter{0};
  BackendRegistry registry;
  EXPECT_THAT(backends::register_builtin_backends(registry), IsOk());
  RpcOptions options;
  options.backend = backend;
  options.backend_settings = settings;
  options.init_method = absl::StrCat("memory://auth_checks_", counter++);
  options.default_timeout = absl::Seconds(20);
  const int size = static_cast<int>(secrets.size());
  std::vector<std::unique_ptr<Worker>> workers(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank, options]() mutable {
      options.auth_secret = secrets[rank];
      absl::StatusOr<std::unique_ptr<Worker>> w = Worker::create(
          absl::StrCat("w", rank), rank, size, options, registry);
      EXPECT_THAT(w, IsOk());
      if (w.ok()) workers[rank] = *std::move(w);
    });
  }
  for (auto& t : threads) t.join();
  return workers;
}

// Stops every worker; a lost peer is fine for groups that refused each other.
void stop(std::vector<std::unique_ptr<Worker>>& workers) {
  for (auto& w : workers) {
    if (w != nullptr) {
      EXPECT_THAT(w->shutdown(/*graceful=*/false), IsOk());
    }
  }
}

absl::StatusOr<c10::IValue> add(Worker& from, const std::string& to) {
  return from.rpc_sync(to, "aten::add.Tensor", {at::ones({2}), at::ones({2})});
}

}  // namespace

void expect_same_secret_works(const std::string& backend,
                              const BackendSettings& settings) {
  std::vector<std::unique_ptr<Worker>> workers =
      start(backend, settings, {kSecret, kSecret});
  ASSERT_NE(workers[0], nullptr);
  ASSERT_NE(workers[1], nullptr);
  EXPECT_THAT(add(*workers[0], "w1"), IsOk());
  EXPECT_THAT(add(*workers[1], "w0"), IsOk());
  // Large tensors too (a backend may send them apart from the handshake).
  const at::Tensor large = at::ones({1 << 18});
  absl::StatusOr<c10::IValue> sum =
      workers[1]->rpc_sync("w0", "aten::add.Tensor", {large, large});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(sum->toTensor().equal(large * 2));
  stop(workers);
  // The same through the environment.
  ::setenv(auth::kSecretEnv, kSecret, 1);
  workers = start(backend, settings, {"", ""});
  ::unsetenv(auth::kSecretEnv);
  ASSERT_NE(workers[0], nullptr);
  EXPECT_THAT(add(*workers[0], "w1"), IsOk());
  stop(workers);
}

void expect_wrong_secret_is_refused(const std::string& backend,
                                    const BackendSettings& settings) {
  std::vector<std::unique_ptr<Worker>> workers =
      start(backend, settings, {kSecret, kOtherSecret, kSecret});
  for (const auto& w : workers) ASSERT_NE(w, nullptr);
  EXPECT_THAT(add(*workers[0], "w1"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("w1")));
  EXPECT_THAT(add(*workers[1], "w0"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("w0")));
  // The refusals cost nothing to the right peers.
  EXPECT_THAT(add(*workers[0], "w2"), IsOk());
  EXPECT_THAT(add(*workers[2], "w0"), IsOk());
  stop(workers);
}

void expect_missing_secret_is_refused(const std::string& backend,
                                      const BackendSettings& settings) {
  std::vector<std::unique_ptr<Worker>> workers =
      start(backend, settings, {kSecret, ""});
  for (const auto& w : workers) ASSERT_NE(w, nullptr);
  EXPECT_THAT(add(*workers[1], "w0"),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("requires authentication")));
  EXPECT_THAT(add(*workers[0], "w1"),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       AnyOf(HasSubstr("does not authenticate"),
                             HasSubstr("refused"))));
  stop(workers);
}

}  // namespace tether::testing
