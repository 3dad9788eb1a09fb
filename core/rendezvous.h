// Rendezvous: how the workers of a group find each other at init_rpc.
//
// Used by the Worker before it builds its agent. The init method names a
// c10d store (LibTorch's plumbing, not its RPC): workers claim their name and
// rank there, wait for the whole group, and learn every name. Backends then
// publish their addresses in the same store.
//
// Init methods:
//   "env://"          MASTER_ADDR and MASTER_PORT name a TCPStore (rank 0
//                     serves it, unless TORCHELASTIC_USE_AGENT_STORE=True
//                     says the launcher does, as torchrun's agent and
//                     tools/tether_run do); the launchers' variables give the rank and
//                     world size when the caller passes -1 (RANK/WORLD_SIZE,
//                     Slurm's SLURM_PROCID/SLURM_NTASKS, Open MPI's
//                     OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE).
//   "tcp://HOST:PORT" a TCPStore at that address, served by rank 0.
//   "file://PATH"     a FileStore on a shared file system.
//   "memory://KEY"    one process: a HashStore per KEY (in-process groups,
//                     such as loopback tests).
#ifndef TETHER_CORE_RENDEZVOUS_H_
#define TETHER_CORE_RENDEZVOUS_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>

#include <memory>
#include <string>
#include <vector>

#include "core/agent.h"

namespace tether {

// Passed as the world size: join a dynamic group (the peer's init_rpc
// without a world size). Its members join and leave while it runs; the
// rank is still the caller's (or the launcher's) and must be unique.
inline constexpr int kDynamicGroup = 0;

struct RendezvousResult {
  WorkerInfo self;
  std::shared_ptr<c10d::Store> store;
  // Rank order. Empty for a dynamic group: the Worker reads the members
  // under the membership token (core/join/membership.h).
  std::vector<WorkerInfo> workers;
  std::string group_key;
  bool dynamic = false;
  // rendezvous_host(init_method), for AgentSetup::rendezvous_host.
  std::string host;
};

// The host the init method's store is at: MASTER_ADDR for env://, HOST of
// tcp://HOST:PORT (without IPv6 brackets); "" for file://, memory:// and
// anything else.
std::string rendezvous_host(absl::string_view init_method);

// What the launcher that started this process says about it: torchrun's and
// tether_run's RANK / WORLD_SIZE / LOCAL_RANK, Slurm's SLURM_PROCID /
// SLURM_NTASKS / SLURM_LOCALID, Open MPI's OMPI_COMM_WORLD_RANK /
// OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK, in that order.
struct LauncherEnv {
  int rank = -1;
  int world_size = -1;
  int local_rank = 0;  // 0 when no variable gives it
};
// INVALID_ARGUMENT naming the variables when no launcher set rank and world
// size (or one is not a number).
[[nodiscard]] absl::StatusOr<LauncherEnv> launcher_env();

// Checks a worker name: 1 to 128 characters of [A-Za-z0-9_.-].
[[nodiscard]] absl::Status validate_worker_name(absl::string_view name);

// Joins the group. A negative rank or world size is read from the
// environment (see above). Errors: INVALID_ARGUMENT for a bad name, rank, world size
// or init method; ALREADY_EXISTS for a name or rank taken by another worker;
// DEADLINE_EXCEEDED naming the ranks still missing after `timeout`.
// With world_size kDynamicGroup it only opens the store (rank 0 serves it
// for env:// and tcp://, so rank 0 starts the group and leaves it last) and
// marks the group dynamic; FAILED_PRECONDITION when static and dynamic
// members mix, either way round.
[[nodiscard]] absl::StatusOr<RendezvousResult> rendezvous(
    absl::string_view init_method, absl::string_view name, int rank,
    int world_size, absl::Duration timeout);

}  // namespace tether

#endif  // TETHER_CORE_RENDEZVOUS_H_
