#!/usr/bin/env bash
# Starts the pipeline example across local worker processes with the
# launcher: run_pipeline.sh [--nproc N] [pipeline flags...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
find_runfile() {
  for candidate in "$here/$1" "${RUNFILES_DIR:-$0.runfiles}/tether/$1" "$0.runfiles/tether/$1"; do
    if [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
  echo "run_pipeline: cannot find $1" >&2
  exit 1
}
nproc=3
if [ "${1:-}" = "--nproc" ]; then nproc="$2"; shift 2; fi
exec "$(find_runfile tools/tether_run)" --nproc "$nproc" -- "$(find_runfile examples/pipeline)" "$@"
