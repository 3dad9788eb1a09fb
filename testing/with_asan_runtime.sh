#!/usr/bin/env bash
# Runs a test under `--config=asan` (through --run_under, see .bazelrc) with
# TETHER_ASAN_RUNTIME naming the ASan runtime and libstdc++ of the gcc that
# built it. A test script that starts a program not built with ASan which
# then loads tether's ASan-built code (Debian's python3 importing tether, an
# outside CMake project's program) preloads both (LD_PRELOAD): ASan wants its
# runtime first in the process, and its interceptor of __cxa_throw needs
# libstdc++ already loaded.
set -euo pipefail
TETHER_ASAN_RUNTIME="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export TETHER_ASAN_RUNTIME
exec "$@"
