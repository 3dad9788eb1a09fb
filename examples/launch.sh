#!/usr/bin/env bash
# Starts an example across local worker processes with the launcher:
#   launch.sh EXAMPLE [--nproc N] [example flags...]
# EXAMPLE is the example's path in the workspace (examples/train); the BUILD
# file's run_* targets pass it, so `bazel run //examples:run_training --
# --nproc 3` works.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
find_runfile() {
  for candidate in "$here/$1" "${RUNFILES_DIR:-$0.runfiles}/tether/$1" "$0.runfiles/tether/$1"; do
    if [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
  echo "launch.sh: cannot find $1" >&2
  exit 1
}
example="$1"
shift
nproc=3
if [ "${1:-}" = "--nproc" ]; then nproc="$2"; shift 2; fi
exec "$(find_runfile tools/tether_run)" --nproc "$nproc" -- "$(find_runfile "$example")" "$@"
