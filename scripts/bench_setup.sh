#!/usr/bin/env bash
# Installs what the bench CLI (tools/bench.py) needs beyond the
# build: Debian's python3-torch (the peer, torch.distributed.rpc, for
# /usr/bin/python3), python3-matplotlib (the plots) and OpenBLAS
# (libopenblas0-serial). With --profilers, also linux-perf and valgrind, used
# to profile what misses a target (docs/benchmarks.md). Idempotent, like
# scripts/setup.sh which it extends.
#
# OpenBLAS: Debian's LibTorch (and the peer's torch) call libblas.so.3,
# which without it is the reference netlib BLAS: the distributed autograd
# step's Linear(256, 256) took 6 to 10 ms of compute there and 1.0 to 1.1 ms
# on OpenBLAS (docs/benchmarks.md). Installing it switches the
# libblas.so.3 alternative of the whole machine (update-alternatives), for
# tether and the peer alike. The serial build, because the two benchmark
# processes share the cores and LibTorch runs its own threads; to undo:
# update-alternatives --config libblas.so.3-x86_64-linux-gnu.
set -euo pipefail

extra=(python3-torch python3-matplotlib libopenblas0-serial)
if [ "${1:-}" = "--profilers" ]; then
  extra+=(linux-perf valgrind)
fi
exec "$(dirname "$0")/setup.sh" "${extra[@]}"
