#!/usr/bin/env bash
# Runs the launcher for real: env variables, prefixed output, failure handling.
set -uo pipefail
run="$1"
fail() { echo "FAIL: $*"; exit 1; }

out=$("$run" --nproc 3 -- sh -c 'echo "rank=$RANK of $WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT"') ||
  fail "three healthy workers should succeed"
for r in 0 1 2; do
  grep -q "^\[$r\] rank=$r of 3 at 127.0.0.1:[0-9]" <<<"$out" || fail "missing line of rank $r: $out"
done

# Rank 1 fails; rank 0 would sleep for a minute and must be stopped early.
start=$(date +%s)
"$run" --nproc 2 --grace_ms 1000 -- sh -c 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60' \
  >/tmp/tether_run_test.$$ 2>&1 && fail "a failing rank must fail the launch"
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -lt 30 ] || fail "the other ranks were not stopped (took ${elapsed}s)"
grep -q "rank 1 exited with 3" /tmp/tether_run_test.$$ || fail "failure not named: $(cat /tmp/tether_run_test.$$)"
rm -f /tmp/tether_run_test.$$

# The launcher serves the rendezvous store on MASTER_PORT before any worker
# starts (no race for the port) and says so as torchrun's agent does.
out=$("$run" --nproc 2 -- bash -c 'exec 3<>/dev/tcp/127.0.0.1/$MASTER_PORT && echo "store reachable, agent store=$TORCHELASTIC_USE_AGENT_STORE"') ||
  fail "the workers could not reach the launcher's store: $out"
for r in 0 1; do
  grep -q "^\[$r\] store reachable, agent store=True" <<<"$out" || fail "rank $r: $out"
done

# A program per rank (mpirun's MPMD form); without --nproc, one rank each.
out=$("$run" -- sh -c 'echo "ps $RANK/$WORLD_SIZE"' : sh -c 'echo "trainer $RANK/$WORLD_SIZE"') ||
  fail "per-rank programs should succeed: $out"
grep -q "^\[0\] ps 0/2" <<<"$out" || fail "rank 0 did not run the first program: $out"
grep -q "^\[1\] trainer 1/2" <<<"$out" || fail "rank 1 did not run the second program: $out"
out=$("$run" --nproc 3 -- sh -c 'echo "ps $RANK"' : sh -c 'echo "trainer $RANK"')
grep -q "^\[2\] trainer 2" <<<"$out" || fail "the last program should fill the ranks: $out"

"$run" --help | grep -q "usage: tether_run" || fail "--help should print the usage"

"$run" --nproc 0 -- true 2>/dev/null && fail "--nproc 0 must be refused"
"$run" --nproc 2 2>/dev/null && fail "a missing program must be refused"
echo "tether_run: all checks passed"
