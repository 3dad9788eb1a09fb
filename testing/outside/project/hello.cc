// A user's program built in its own workspace: two workers started by a
// launcher (tether_run, torchrun, mpirun, srun), a call each way over the
// default backend, a remote value fetched through its RRef.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>

#include <cstdio>

#include "tether/tether.h"

namespace {

absl::Status run() {
  TETHER_ASSIGN_OR_RETURN(tether::LauncherEnv env, tether::launcher_env());
  const std::string me = absl::StrCat("worker", env.rank);
  const std::string peer = absl::StrCat("worker", (env.rank + 1) % env.world_size);
  TETHER_RETURN_IF_ERROR(tether::init_rpc(me));
  at::Tensor ones = at::ones({2, 2});
  TETHER_ASSIGN_OR_RETURN(at::Tensor sum,
                   tether::rpc_sync<at::Tensor>(peer, "aten::add.Tensor",
                                                {ones, ones * env.rank}));
  if (!sum.equal(ones * (env.rank + 1))) {
    return absl::InternalError(absl::StrCat(me, ": wrong sum from ", peer));
  }
  {  // A value left on the peer, fetched through its RRef (released here).
    TETHER_ASSIGN_OR_RETURN(
        tether::RRef rref,
        tether::remote(peer, "aten::mul.Scalar", {ones, env.rank + 2}));
    TETHER_ASSIGN_OR_RETURN(c10::IValue value, rref.to_here());
    if (!value.isTensor() || !value.toTensor().equal(ones * (env.rank + 2))) {
      return absl::InternalError(absl::StrCat(me, ": wrong value from ", peer));
    }
  }
  std::printf("%s: %s added and multiplied\n", me.c_str(), peer.c_str());
  return tether::shutdown();
}

}  // namespace

int main() {
  absl::Status status = run();
  if (!status.ok()) {
    std::fprintf(stderr, "hello: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
