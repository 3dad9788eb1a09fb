#!/usr/bin/env bash
# Installs what the bench CLI (tools/bench.py, issue #9) needs beyond the
# build: Debian's python3-torch (the peer, torch.distributed.rpc, for
# /usr/bin/python3) and python3-matplotlib (the plots). With --profilers,
# also linux-perf and valgrind, used to profile what misses a target
# (docs/benchmarks.md). Idempotent, like scripts/setup.sh which it extends.
set -euo pipefail

extra=(python3-torch python3-matplotlib)
if [ "${1:-}" = "--profilers" ]; then
  extra+=(linux-perf valgrind)
fi
exec "$(dirname "$0")/setup.sh" "${extra[@]}"
