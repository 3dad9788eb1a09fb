// tether/tether.h: the one include of a program that uses tether, and
// init_rpc with defaults that need nothing else.
//
//   #include "tether/tether.h"
//
//   int main() {
//     // Rank and world size from the launcher (tether_run, torchrun,
//     // mpirun, srun), the built-in backends, RRefs and distributed
//     // autograd on.
//     absl::Status up = tether::init_rpc("worker0");
//     if (!up.ok()) { ... }
//     absl::StatusOr<at::Tensor> sum = tether::rpc_sync<at::Tensor>(
//         "worker1", "aten::add", {torch::ones({2}), 3});
//     if (!sum.ok()) { ... }  // never `->` or `*` on a failed StatusOr
//     ...
//     absl::Status down = tether::shutdown();
//     if (!down.ok()) { ... }
//   }
//
// A function that returns a Status says it shorter with core/status_macros.h
// (TETHER_ASSIGN_OR_RETURN, TETHER_RETURN_IF_ERROR); examples/seeds/ are
// whole programs written so.
//
// The registry and the extensions of core/rpc.h's init_rpc remain for
// programs that want their own (another backend, no RRef layer, ...).
#ifndef TETHER_TETHER_TETHER_H_
#define TETHER_TETHER_TETHER_H_

#include <absl/status/status.h>

#include <functional>
#include <string>

#include "autograd/autograd.h"
#include "autograd/rref_backward.h"
#include "core/rendezvous.h"
#include "core/rpc.h"
#include "core/status_macros.h"
#include "optim/optimizer.h"
#include "rref/remote_module.h"
#include "rref/rref.h"
#include "tether/checkpoint.h"
#include "tether/version.h"  // TETHER_VERSION, tether::kVersion

namespace tether {

// Joins the group as `name` with the launcher's rank and world size
// (core/rendezvous.h, launcher_env), over the built-in backends, with the
// RRef and distributed autograd layers. Errors as core/rpc.h's init_rpc.
[[nodiscard]] absl::Status init_rpc(const std::string& name,
                                    const RpcOptions& options);

// The same with the options' defaults, but the backend named by the
// environment variable TETHER_BACKEND when it is set (as the Python front
// end reads it): the launcher's environment chooses it, as it chooses the
// rank.
[[nodiscard]] absl::Status init_rpc(const std::string& name);

// RpcOptions' defaults, with the backend of TETHER_BACKEND if set.
RpcOptions options_from_environment();

// The main() of a program a launcher starts once per rank: runs
// `worker(rank)` with the launcher's rank (launcher_env), prints a failure
// to stderr, and returns the process's exit code (0 only if OK).
//
//   int main() { return tether::run_main(run_worker); }
int run_main(const std::function<absl::Status(int rank)>& worker);

// The same with an explicit rank and world size.
[[nodiscard]] absl::Status init_rpc(const std::string& name, int rank,
                                    int world_size,
                                    const RpcOptions& options = RpcOptions());

}  // namespace tether

#endif  // TETHER_TETHER_TETHER_H_
