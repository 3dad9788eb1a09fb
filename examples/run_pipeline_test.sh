#!/usr/bin/env bash
# The main job, as the README runs it, on a small workload.
set -euo pipefail
out=$("$1" "$2" --nproc 3 --batches=40 2>&1)
echo "$out"
grep -q "summary: 40 micro-batches .* matches local" <<<"$out"
