#!/usr/bin/env bash
# The main job, as the README runs it, on a small workload: a parameter
# server and two trainers, then one trainer checked against local training.
set -euo pipefail
out=$("$1" "$2" --nproc 3 --steps=40 2>&1)
echo "$out"
grep -q "trainer1 summary: 40 steps" <<<"$out"
grep -q "trainer2 summary: 40 steps" <<<"$out"
out=$("$1" "$2" --nproc 2 --steps=40 2>&1)
echo "$out"
grep -q "trainer1 check: every step's loss matches" <<<"$out"
