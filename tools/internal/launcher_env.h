// The variables a launcher (tools/tether_run, torchrun, ...) gives each
// worker process, read by the two-process benchmark tools
// (tools/bench_worker.cc, tools/rpc_latency.cc).
#ifndef TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_
#define TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_

#include <absl/strings/numbers.h>

#include <cstdio>
#include <cstdlib>

namespace tether::bench {

// The integer in environment variable `name` (RANK, WORLD_SIZE,
// MASTER_PORT); exits with status 2, naming `tool`, if it is not set.
inline int launcher_env(const char* tool, const char* name) {
  const char* value = std::getenv(name);
  int out = -1;
  if (value == nullptr || !absl::SimpleAtoi(value, &out)) {
    std::fprintf(stderr, "%s: %s is not set; run under tether_run --nproc 2\n",
                 tool, name);
    std::exit(2);
  }
  return out;
}

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_LAUNCHER_ENV_H_
