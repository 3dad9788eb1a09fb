#!/usr/bin/env bash
# Runs the launcher for real: env variables, prefixed output, failure
# handling, its exit status, signals to it, and its death.
set -uo pipefail
run="$(readlink -f "$1")"
fail() { echo "FAIL: $*"; exit 1; }
# Job control: a background job gets its own process group and keeps SIGINT
# (a script's background jobs otherwise start with SIGINT ignored).
set -m
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/tether_run_test.XXXXXX")"
leftovers=()
cleanup() {
  for pid in "${leftovers[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
ms() { echo $(( $(date +%s%N) / 1000000 )); }

out=$("$run" --nproc 3 -- sh -c 'echo "rank=$RANK of $WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT"') ||
  fail "three healthy workers should succeed"
for r in 0 1 2; do
  grep -q "^\[$r\] rank=$r of 3 at 127.0.0.1:[0-9]" <<<"$out" || fail "missing line of rank $r: $out"
done

# Rank 1 fails; rank 0 would sleep for a minute and must be stopped early.
# The exit status is the failed worker's, and a line names it.
start=$(date +%s)
"$run" --nproc 2 --grace_ms 1000 -- sh -c 'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 60' \
  >"$tmp/out" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -lt 30 ] || fail "the other ranks were not stopped (took ${elapsed}s)"
[ "$status" -eq 3 ] || fail "exit status $status, not rank 1's 3: $(cat "$tmp/out")"
grep -q "^tether_run: rank 1 exited with 3; stopping the others" "$tmp/out" ||
  fail "failure not named: $(cat "$tmp/out")"
grep -q "^tether_run: failed: rank 1 first, exited with 3$" "$tmp/out" ||
  fail "no last line naming the first failure: $(cat "$tmp/out")"

# A worker killed by a signal: 128 + the signal, as a shell reports it. The
# others, stopped by the launcher, are not taken for the first failure.
"$run" --nproc 3 --grace_ms 1000 -- sh -c 'if [ "$RANK" = 2 ]; then kill -KILL $$; fi; exec sleep 60' \
  >"$tmp/out" 2>&1
status=$?
[ "$status" -eq 137 ] || fail "exit status $status, not 128 + 9: $(cat "$tmp/out")"
grep -q "^tether_run: failed: rank 2 first, killed by signal 9 (Killed)$" "$tmp/out" ||
  fail "the signal is not named: $(cat "$tmp/out")"

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

# Starts the launcher in the background over N workers that each write their
# pid to a fifo and then run WORKER (a shell command); sets `launcher` and
# `workers` once every worker has started.
start_group() {
  local n="$1" grace="$2" worker="$3"
  rm -f "$tmp/ready"
  mkfifo "$tmp/ready"
  "$run" --nproc "$n" --grace_ms "$grace" -- \
    sh -c 'echo $$ > "$0"; '"$worker" "$tmp/ready" >"$tmp/out" 2>&1 &
  launcher=$!
  leftovers+=("$launcher")
  workers=()
  exec 3<>"$tmp/ready"
  local pid
  for _ in $(seq "$n"); do
    read -r -t 60 -u 3 pid || fail "the workers did not start: $(cat "$tmp/out")"
    workers+=("$pid")
    leftovers+=("$pid")
  done
  exec 3<&-
}

# Whether PID runs (a zombie has ended).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ "$state" != Z ]
}

# Waits up to SECONDS for every worker to end; fails naming those that run.
expect_workers_gone() {
  local deadline=$(( $(ms) + $1 * 1000 )) why="$2" pid still=()
  for pid in "${workers[@]}"; do
    while alive "$pid" && [ "$(ms)" -lt "$deadline" ]; do sleep 0.01; done
    if alive "$pid"; then still+=("$pid"); fi
  done
  [ "${#still[@]}" -eq 0 ] || fail "$why: worker(s) ${still[*]} still run: $(cat "$tmp/out")"
}

# Waits up to SECONDS for a line of the launcher's output matching PATTERN.
wait_for_line() {
  timeout "$2" bash -c 'until grep -q "$0" "$1"; do sleep 0.02; done' "$1" "$tmp/out" ||
    fail "no line '$1' within $2 s: $(cat "$tmp/out")"
}

# SIGTERM or SIGINT to the launcher reaches every worker (passed on as it
# came), the workers end, and the launcher exits with 128 + the signal.
for sig in TERM INT; do
  start_group 3 5000 'exec sleep 60'
  sent=$(ms)
  kill -"$sig" "$launcher"
  wait "$launcher" 2>/dev/null
  status=$?
  took=$(( $(ms) - sent ))
  expect_workers_gone 5 "after SIG$sig to the launcher"
  want=$(( 128 + $(kill -l "$sig") ))
  [ "$status" -eq "$want" ] || fail "SIG$sig: exit status $status, not $want: $(cat "$tmp/out")"
  [ "$took" -lt 4000 ] || fail "SIG$sig: the launcher took $took ms, not the workers' end"
  grep -q "^tether_run: SIG$sig received; passing it on to the workers" "$tmp/out" ||
    fail "SIG$sig: no line says so: $(cat "$tmp/out")"
  echo "SIG$sig to tether_run: every worker and the launcher ended in $took ms"
done

# A worker that ignores SIGTERM is killed after the grace period.
start_group 2 1000 'trap "" TERM; exec sleep 60'
sent=$(ms)
kill -TERM "$launcher"
wait "$launcher" 2>/dev/null
status=$?
took=$(( $(ms) - sent ))
expect_workers_gone 5 "a worker that ignores SIGTERM"
[ "$status" -eq 143 ] || fail "exit status $status after SIGTERM: $(cat "$tmp/out")"
[ "$took" -ge 900 ] && [ "$took" -lt 4000 ] ||
  fail "the grace of 1000 ms took $took ms: $(cat "$tmp/out")"

# A second signal does not wait for the grace period.
start_group 2 30000 'trap "" INT TERM; exec sleep 60'
sent=$(ms)
kill -INT "$launcher"
wait_for_line "^tether_run: SIGINT received" 10
kill -INT "$launcher"
wait "$launcher" 2>/dev/null
status=$?
took=$(( $(ms) - sent ))
expect_workers_gone 5 "after a second SIGINT"
[ "$took" -lt 10000 ] || fail "a second SIGINT waited for the grace: $took ms"
[ "$status" -eq 130 ] || fail "exit status $status after SIGINT: $(cat "$tmp/out")"

# The launcher killed with SIGKILL: its workers do not outlive it (each dies
# with it, by its parent-death signal).
start_group 3 5000 'exec sleep 60'
sent=$(ms)
kill -KILL "$launcher"
wait "$launcher" 2>/dev/null
expect_workers_gone 5 "the launcher was killed with SIGKILL"
echo "SIGKILL to tether_run: every worker ended within $(( $(ms) - sent )) ms"

# --max_restarts: rank 1 fails in attempts 0 and 1 and succeeds in attempt
# 2; every rank starts again each time, told its attempt. Rank 1 fails only
# once rank 0 has printed its line (a marker file, waited for at most 10 s),
# so that the launcher's SIGTERM cannot reach rank 0 before it prints.
MARK="$tmp/printed" "$run" --nproc 2 --grace_ms 1000 --max_restarts 2 -- sh -c \
  'echo "attempt $TORCHELASTIC_RESTART_COUNT of max $TORCHELASTIC_MAX_RESTARTS"
   if [ "$RANK" = 0 ]; then touch "$MARK.$TORCHELASTIC_RESTART_COUNT"; exec sleep 1; fi
   n=0; while [ ! -e "$MARK.$TORCHELASTIC_RESTART_COUNT" ] && [ "$n" -lt 200 ]; do sleep 0.05; n=$((n + 1)); done
   [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ] && exit 4; exit 0' \
  >"$tmp/out" 2>&1
status=$?
[ "$status" -eq 0 ] || fail "exit status $status after a successful third attempt: $(cat "$tmp/out")"
for attempt in 0 1 2; do
  [ "$(grep -c "^\[[01]\] attempt $attempt of max 2$" "$tmp/out")" -eq 2 ] ||
    fail "both ranks should run attempt $attempt: $(cat "$tmp/out")"
done
for restart in 1 2; do
  grep -q "^tether_run: restart $restart of 2: rank 1 exited with 4; starting all 2 workers again$" "$tmp/out" ||
    fail "no line for restart $restart: $(cat "$tmp/out")"
done

# Failing in every attempt: K restarts, then the last attempt's status.
"$run" --nproc=2 --grace_ms=1000 --max_restarts=1 -- sh -c \
  'if [ "$RANK" = 0 ]; then exit $((5 + TORCHELASTIC_RESTART_COUNT)); fi; exec sleep 60' \
  >"$tmp/out" 2>&1
status=$?
[ "$status" -eq 6 ] || fail "exit status $status, not the last attempt's 6: $(cat "$tmp/out")"
[ "$(grep -c "^tether_run: restart" "$tmp/out")" -eq 1 ] || fail "not one restart: $(cat "$tmp/out")"
grep -q "^tether_run: no restart left (--max_restarts 1)$" "$tmp/out" || fail "$(cat "$tmp/out")"
grep -q "^tether_run: failed: rank 0 first, exited with 6$" "$tmp/out" || fail "$(cat "$tmp/out")"
"$run" --max_restarts -1 -- true 2>"$tmp/out" && fail "--max_restarts -1 accepted"
grep -q "bad --max_restarts" "$tmp/out" || fail "$(cat "$tmp/out")"

echo "tether_run: all checks passed"
