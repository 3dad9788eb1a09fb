#!/usr/bin/env bash
# The main job at length: 9000 steps, far longer than any timeout, with the
# parameter server waiting in shutdown() the whole time. Tagged manual
# (several minutes): bazel test //examples:run_training_long_test
set -euo pipefail
start=$(date +%s)
out=$("$1" "$2" --nproc 3 --steps=9000 2>&1)
echo "$out" | tail -20
echo "run took $(( $(date +%s) - start )) s"
grep -q "trainer1 summary: 9000 steps" <<<"$out"
grep -q "trainer2 summary: 9000 steps" <<<"$out"
grep -q "ps: all trainers done" <<<"$out"
