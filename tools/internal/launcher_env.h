// What the launcher (tools/tether_run, torchrun, mpirun, srun) tells each
// worker process, for the two-process tools (tools/bench_worker.cc,
// tools/rpc_latency.cc, tools/fabric_pingpong.cc): the rank and world size
// through tether::launcher_env(), as every program tether ships reads them,
// the store's MASTER_PORT, and a client of that store for what the two
// processes tell each other outside tether (a raw baseline's port, a
// fabric's name).
#ifndef TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_
#define TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_

#include <absl/status/statusor.h>
#include <absl/strings/numbers.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/host_address.h"
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

// The launcher's store at MASTER_ADDR:MASTER_PORT: tether_run (like
// torchrun's agent, TORCHELASTIC_USE_AGENT_STORE=True) serves it; under
// another launcher rank 0 does. Exits with status 2, naming `tool`, if
// MASTER_PORT is not set.
inline std::unique_ptr<c10d::TCPStore> launcher_store(const char* tool,
                                                      int rank) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(master_port(tool));
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  options.isServer = rank == 0 && (agent_store == nullptr ||
                                   std::string(agent_store) != "True");
  options.numWorkers = 2;
  options.timeout = std::chrono::seconds(60);
  const char* host = std::getenv("MASTER_ADDR");
  return std::make_unique<c10d::TCPStore>(
      host != nullptr ? host : "127.0.0.1", options);
}

// The address a raw baseline's listening side listens on and publishes, as
// tether's backends choose theirs (core/host_address.h) from MASTER_ADDR:
// 127.0.0.1 under tether_run, the host's own address across hosts.
inline absl::StatusOr<std::string> listen_address() {
  const char* host = std::getenv("MASTER_ADDR");
  return default_host_address(host != nullptr ? host : "");
}

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_
