#!/usr/bin/env bash
# The main job, as the README runs it, on a small workload: a parameter
# server and two trainers, then one trainer checked against local training.
set -euo pipefail
# The parameter server calls shutdown() right after init and waits there
# while the trainers work: with a peer timeout of 200 ms, far shorter than
# the run, its wait must still succeed (liveness bounds it, not a guess).
start=$(date +%s%N)
out=$("$1" "$2" --nproc 3 --steps=40 --peer_timeout_ms=200 2>&1)
echo "$out"
echo "run took $(( ($(date +%s%N) - start) / 1000000 )) ms"
grep -q "trainer1 summary: 40 steps" <<<"$out"
grep -q "trainer2 summary: 40 steps" <<<"$out"
grep -q "ps: all trainers done" <<<"$out"
out=$("$1" "$2" --nproc 2 --steps=40 2>&1)
echo "$out"
grep -q "trainer1 check: every step's loss matches" <<<"$out"
