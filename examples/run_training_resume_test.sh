#!/usr/bin/env bash
# The main job stopped and started again, as torchrun users run theirs:
#
#   run_training_resume_test.sh RUN_TRAINING EXAMPLE BACKEND TRAINERS
#
# 1. With one trainer (TRAINERS=1): the job runs uninterrupted, each step's
#    loss to a log.
# 2. The job again with --checkpoint_dir and --checkpoint_every: once the
#    checkpoint of step 10 is complete, a trainer is killed with SIGKILL
#    mid-run, so the job fails.
# 3. Started again with the same flags, it resumes after the last complete
#    checkpoint and runs to the end.
# With one trainer the loss of every step, the resumed run's where both
# runs took it, equals the uninterrupted run's to the last digit. With two
# (TRAINERS=2, which share the parameter server in no fixed order) both
# resume from the same step and finish.
set -euo pipefail
run="$1"
example="$2"
backend="$3"
trainers="$4"
steps=60
every=10
tmp="$(TMPDIR="${TEST_TMPDIR:-${TMPDIR:-}}" mktemp -d -t resume.XXXXXX)"
nproc=$((trainers + 1))
victim="trainer$trainers"
fail() { echo "FAIL ($backend, $trainers trainer(s)): $*" >&2; exit 1; }
show() { grep -v " step .*/$steps " "$1" || true; }

common=(--nproc "$nproc" --steps=$steps --backend="$backend")
if [ "$trainers" = 1 ]; then
  start=$(date +%s%N)
  "$run" "$example" "${common[@]}" --loss_log="$tmp/uninterrupted.log" \
      >"$tmp/uninterrupted.out" 2>&1 || { show "$tmp/uninterrupted.out"; fail "the uninterrupted run failed"; }
  echo "uninterrupted run: $(( ($(date +%s%N) - start) / 1000000 )) ms"
fi

flags=("${common[@]}" --checkpoint_dir="$tmp/ckpt" --checkpoint_every=$every
       --loss_log="$tmp/resumed.log")
start=$(date +%s%N)
# Made before the job starts: the job's own redirection happens in its
# child, which the loop below may outrun.
: >"$tmp/killed.out"
"$run" "$example" "${flags[@]}" >>"$tmp/killed.out" 2>&1 &
job=$!
# Bounded: the run would end on its own well within it.
deadline=$((SECONDS + 120))
pid=""
until [ -n "$pid" ] && [ -e "$tmp/ckpt/step-00000010/COMPLETE" ]; do
  [ "$SECONDS" -lt "$deadline" ] || { show "$tmp/killed.out"; fail "no checkpoint of step 10"; }
  pid="$(sed -n "s/.*$victim: rank $trainers of $nproc, local rank $trainers, pid \([0-9]*\).*/\1/p" "$tmp/killed.out")"
  sleep 0.05
done
kill -KILL "$pid"
status=0
wait "$job" || status=$?
show "$tmp/killed.out"
echo "killed run: $(( ($(date +%s%N) - start) / 1000000 )) ms, exit $status"
[ "$status" -ne 0 ] || fail "the run whose $victim was killed exited 0"
grep -q "killed by signal 9" "$tmp/killed.out" || fail "$victim was not killed by SIGKILL"

start=$(date +%s%N)
"$run" "$example" "${flags[@]}" >"$tmp/resumed.out" 2>&1 || { show "$tmp/resumed.out"; fail "the resumed run failed"; }
show "$tmp/resumed.out"
echo "resumed run: $(( ($(date +%s%N) - start) / 1000000 )) ms"
resumed_at="$(sed -n 's/.*trainer1: resumed from the checkpoint of step \([0-9]*\).*/\1/p' "$tmp/resumed.out")"
[ -n "$resumed_at" ] && [ "$resumed_at" -ge 10 ] || fail "trainer1 did not resume from a checkpoint"
for r in $(seq 1 "$trainers"); do
  grep -q "trainer$r: resumed from the checkpoint of step $resumed_at " "$tmp/resumed.out" ||
    fail "trainer$r did not resume from step $resumed_at"
  grep -q "trainer$r summary: $((steps - resumed_at)) steps" "$tmp/resumed.out" ||
    fail "trainer$r did not run the steps after $resumed_at"
done
grep -q "ps: all trainers done" "$tmp/resumed.out" || fail "the parameter server did not finish"
echo "checkpoints kept: $(ls "$tmp/ckpt" | tr '\n' ' ')"

if [ "$trainers" = 1 ]; then
  # The resumed curve: each step's last logged loss (steps run twice, after
  # the checkpoint and before the kill, take the resumed run's).
  awk '{ loss[$2] = $3 } END { for (s in loss) print s, loss[s] }' "$tmp/resumed.log" |
    sort -n >"$tmp/resumed.curve"
  awk '{ print $2, $3 }' "$tmp/uninterrupted.log" | sort -n >"$tmp/uninterrupted.curve"
  [ "$(wc -l <"$tmp/uninterrupted.curve")" -eq $steps ] || fail "the uninterrupted run logged $(wc -l <"$tmp/uninterrupted.curve") steps"
  [ "$(wc -l <"$tmp/resumed.curve")" -eq $steps ] || fail "the resumed run logged $(wc -l <"$tmp/resumed.curve") steps"
  awk 'NR == FNR { want[$1] = $2; next }
       { d = $2 - want[$1]; if (d < 0) d = -d; if (d > worst) worst = d;
         if ($2 != want[$1]) differ++ }
       END { printf "loss curves: %d steps compared, %d differ, max difference %g\n",
             FNR, differ, worst; exit differ > 0 }' \
      "$tmp/uninterrupted.curve" "$tmp/resumed.curve" ||
    fail "the resumed run's losses differ from the uninterrupted run's"
  rerun="$(awk -v k="$resumed_at" '$2 > k' "$tmp/resumed.log" | wc -l)"
  echo "steps after the checkpoint logged (by both runs): $rerun"
fi
echo "PASS ($backend, $trainers trainer(s), resumed after step $resumed_at)"
