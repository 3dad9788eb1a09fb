#!/usr/bin/env bash
# Runs a seed program across local processes with the launcher:
#   run_seed_test.sh TETHER_RUN NPROC PROGRAM PATTERN
# on the backend TETHER_BACKEND names; passes if every rank exits 0 and the
# output has a line matching PATTERN.
set -euo pipefail
out=$("$1" --nproc "$2" -- "$3" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
grep -Eq "$4" <<<"$out"
