// What the launcher (tools/tether_run, torchrun, mpirun, srun) tells each
// worker process, for the two-process tools (tools/bench_worker.cc,
// tools/rpc_latency.cc, tools/fabric_pingpong.cc): the rank and world size
// through tether::launcher_env(), as every program tether ships reads them,
// and the store's MASTER_PORT.
#ifndef TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_
#define TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_

#include <absl/strings/numbers.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/rendezvous.h"

namespace tether::bench {

// This process's rank and world size from whichever launcher started it;
// exits with status 2, naming `tool` and the variables, if none did.
inline LauncherEnv launched(const char* tool) {
  absl::StatusOr<LauncherEnv> env = launcher_env();
  if (!env.ok()) {
    std::fprintf(stderr, "%s: %s; run under tether_run --nproc 2\n", tool,
                 std::string(env.status().message()).c_str());
    std::exit(2);
  }
  return *env;
}

// The rendezvous store's port (MASTER_PORT); exits with status 2, naming
// `tool`, if it is not set.
inline int master_port(const char* tool) {
  const char* value = std::getenv("MASTER_PORT");
  int out = -1;
  if (value == nullptr || !absl::SimpleAtoi(value, &out)) {
    std::fprintf(stderr,
                 "%s: MASTER_PORT is not set; run under tether_run --nproc 2\n",
                 tool);
    std::exit(2);
  }
  return out;
}

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_
