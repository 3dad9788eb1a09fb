// init_rpc(name) with nothing else: rank and world size from the launcher's
// variables, the built-in backends, RRefs and distributed autograd on.
#include "tether/tether.h"

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "testing/ports.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

TEST(Tether, InitRpcWithANameAlone) {
  const int port = testing::pick_unused_port();
  ASSERT_GT(port, 0);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", absl::StrCat(port).c_str(), 1);
  ::setenv("SLURM_PROCID", "0", 1);  // as srun would start it
  ::setenv("SLURM_NTASKS", "1", 1);
  ::setenv("SLURM_LOCALID", "0", 1);
  absl::StatusOr<LauncherEnv> env = launcher_env();
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(env->rank, 0);
  EXPECT_EQ(env->world_size, 1);
  EXPECT_EQ(env->local_rank, 0);

  ASSERT_THAT(init_rpc("solo"), IsOk());
  absl::StatusOr<at::Tensor> sum = rpc_sync<at::Tensor>(
      "solo", "aten::add.Tensor", {at::ones({2}), at::ones({2})});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(*sum, at::full({2}, 2.0)));
  // The RRef layer is on.
  absl::StatusOr<RRef> rref =
      remote("solo", "aten::mul.Tensor", {at::ones({2}), at::ones({2})});
  ASSERT_THAT(rref, IsOk());
  absl::StatusOr<c10::IValue> here = rref->to_here();
  ASSERT_THAT(here, IsOk());
  EXPECT_TRUE(at::equal(here->toTensor(), at::ones({2})));
  EXPECT_THAT(shutdown(), IsOk());

  ::unsetenv("SLURM_PROCID");
  EXPECT_THAT(init_rpc("solo"), StatusIs(absl::StatusCode::kInvalidArgument));
  ::unsetenv("SLURM_NTASKS");
  ::unsetenv("SLURM_LOCALID");
}

TEST(Tether, BackendFromTheEnvironment) {
  ::unsetenv("TETHER_BACKEND");
  EXPECT_EQ(options_from_environment().backend, "tensorpipe");
  ::setenv("TETHER_BACKEND", "grpc", 1);
  EXPECT_EQ(options_from_environment().backend, "grpc");
  ::setenv("TETHER_BACKEND", "", 1);  // set but empty is unset
  EXPECT_EQ(options_from_environment().backend, "tensorpipe");
  ::unsetenv("TETHER_BACKEND");
}

TEST(Tether, RunMainReturnsTheExitCodeOfTheWorker) {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  int seen = -1;
  EXPECT_EQ(run_main([&seen](int rank) {
              seen = rank;
              return absl::OkStatus();
            }),
            0);
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(run_main([](int) { return absl::InternalError("failed"); }), 1);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
}

}  // namespace
}  // namespace tether
