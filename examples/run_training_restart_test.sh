#!/usr/bin/env bash
# The main job restarted by its launcher after a trainer is killed:
#
#   run_training_restart_test.sh tether_run|torchrun TETHER_RUN TRAIN BACKEND WORKERS_PY
#
# (tether_run runs the uninterrupted job in both cases; WORKERS_PY picks
# torchrun's port, python/tests/workers.py.)
#
# 1. The job (a parameter server and one trainer) runs uninterrupted, each
#    step's loss to a log.
# 2. The job again under the launcher with --max_restarts=2, checkpointing
#    every 10 steps; the trainer is killed with SIGKILL once it has logged a
#    random step (KILL_AT in the environment picks it; the test prints it).
# 3. The launcher stops the parameter server, starts both again (attempt 1),
#    and the job resumes from its last complete checkpoint and finishes.
# The launcher exits 0 after one restart, and the loss of every step (the
# resumed run's where both attempts took it) equals the uninterrupted
# run's to the last digit, the final loss with it.
set -euo pipefail
launcher="$1"
tether_run="$(readlink -f "$2")"
train="$(readlink -f "$3")"
backend="$4"
workers_py="$5"
steps=60
every=10
kill_at="${KILL_AT:-$((every + 1 + RANDOM % (steps - every - 5)))}"
tmp="$(TMPDIR="${TEST_TMPDIR:-${TMPDIR:-}}" mktemp -d -t restart.XXXXXX)"
fail() { echo "FAIL ($launcher, $backend, killed at step $kill_at): $*" >&2; exit 1; }
show() { grep -v " step .*/$steps " "$1" || true; }
echo "the trainer is killed once it has logged step $kill_at (KILL_AT=$kill_at reproduces)"

flags=(--steps=$steps --backend="$backend")
# The launcher's command with --max_restarts=$1, in cmd.
launcher_command() {
  case "$launcher" in
    tether_run)
      cmd=("$tether_run" --nproc 2 --max_restarts "$1" -- "$train")
      ;;
    torchrun)
      # A free port for torchrun's agent, which serves the store, chosen
      # where no server binding port 0 can take it first.
      local port
      port="$(/usr/bin/python3 "$workers_py")"
      # --redirects 1 --tee 1: torch 1.13's torchrun on Python 3.11 cannot
      # parse its default (run_training_launcher_test.sh). Its agent looks
      # at the workers every --monitor_interval seconds (5 by default).
      # Unbuffered: its tee prints the workers' lines with print(), which
      # would hold them until the end (the test reads the pid as it runs).
      cmd=(env PYTHONUNBUFFERED=1 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2
           --master_addr 127.0.0.1 --master_port "$port"
           --max_restarts "$1" --monitor_interval 0.5
           --redirects 1 --tee 1 --no_python "$train")
      ;;
    *) echo "usage: $0 tether_run|torchrun TETHER_RUN TRAIN BACKEND WORKERS_PY" >&2; exit 2 ;;
  esac
}

start=$(date +%s%N)
timeout 300 "$tether_run" --nproc 2 -- "$train" "${flags[@]}" \
    --loss_log="$tmp/uninterrupted.log" >"$tmp/uninterrupted.out" 2>&1 ||
  { show "$tmp/uninterrupted.out"; fail "the uninterrupted run failed"; }
echo "uninterrupted run: $(( ($(date +%s%N) - start) / 1000000 )) ms"

start=$(date +%s%N)
# Made before the job starts: the job's own redirection happens in its
# child, which the loop below may outrun.
: >"$tmp/restarted.out"
: >"$tmp/restarted.log"
launcher_command 2
timeout 300 "${cmd[@]}" "${flags[@]}" \
    --checkpoint_dir="$tmp/ckpt" --checkpoint_every=$every \
    --loss_log="$tmp/restarted.log" >>"$tmp/restarted.out" 2>&1 &
job=$!
deadline=$((SECONDS + 120))
until grep -q "^trainer1 $kill_at " "$tmp/restarted.log"; do
  [ "$SECONDS" -lt "$deadline" ] || { show "$tmp/restarted.out"; fail "trainer1 never logged step $kill_at"; }
  sleep 0.02
done
pid="$(sed -n 's/.*trainer1: rank 1 of 2, local rank 1, pid \([0-9]*\).*/\1/p' "$tmp/restarted.out" | head -1)"
[ -n "$pid" ] || { show "$tmp/restarted.out"; fail "trainer1 did not say its pid"; }
kill -KILL "$pid"
killed=$(date +%s%N)
# The last step trainer1 logged before it died: it may have run on past
# $kill_at while the loop above looked (it logs a step, then checkpoints
# it). Read now, before the restarted trainer1 logs anything.
logged="$(awk '$1 == "trainer1" { s = $2 } END { print s }' "$tmp/restarted.log")"
status=0
wait "$job" || status=$?
show "$tmp/restarted.out"
echo "restarted run: $(( (killed - start) / 1000000 )) ms to the kill, $(( ($(date +%s%N) - killed) / 1000000 )) ms from the kill to the end, exit $status"
[ "$status" -eq 0 ] || fail "the job exited with $status"
if [ "$launcher" = tether_run ]; then
  grep -q "tether_run: restart 1 of 2: rank 1 killed by signal 9 (Killed)" "$tmp/restarted.out" ||
    fail "tether_run did not say which rank it restarted for"
fi
[ "$(grep -c "trainer1: rank 1 of 2" "$tmp/restarted.out")" -eq 2 ] ||
  fail "trainer1 did not start exactly twice"
resumed_at="$(sed -n 's/.*trainer1: resumed from the checkpoint of step \([0-9]*\).*/\1/p' "$tmp/restarted.out")"
[ -n "$resumed_at" ] || fail "trainer1 did not resume from a checkpoint"
# The last checkpoint of a step trainer1 logged, or the one before it
# (still being written when the kill came).
[ "$resumed_at" -le "$logged" ] && [ "$resumed_at" -ge $(( (logged / every - 1) * every )) ] ||
  fail "trainer1 resumed from step $resumed_at (its last step logged before the kill: $logged)"
grep -q "trainer1 summary: $((steps - resumed_at)) steps" "$tmp/restarted.out" ||
  fail "trainer1 did not run the steps after $resumed_at"
grep -q "ps: all trainers done" "$tmp/restarted.out" || fail "the parameter server did not finish"

# Each step's last logged loss (steps after the checkpoint run by both
# attempts take the resumed one's) against the uninterrupted run's.
awk '{ loss[$2] = $3 } END { for (s in loss) print s, loss[s] }' "$tmp/restarted.log" |
  sort -n >"$tmp/restarted.curve"
awk '{ print $2, $3 }' "$tmp/uninterrupted.log" | sort -n >"$tmp/uninterrupted.curve"
[ "$(wc -l <"$tmp/uninterrupted.curve")" -eq $steps ] || fail "the uninterrupted run logged $(wc -l <"$tmp/uninterrupted.curve") steps"
[ "$(wc -l <"$tmp/restarted.curve")" -eq $steps ] || fail "the restarted run logged $(wc -l <"$tmp/restarted.curve") steps"
awk 'NR == FNR { want[$1] = $2; next }
     { if ($2 != want[$1]) differ++ }
     END { printf "loss curves: %d steps compared, %d differ; final loss %s\n",
           FNR, differ, $2; exit differ > 0 }' \
    "$tmp/uninterrupted.curve" "$tmp/restarted.curve" ||
  fail "the restarted run's losses differ from the uninterrupted run's"
echo "steps run twice (after the checkpoint of step $resumed_at, before the kill): $(awk -v k="$resumed_at" '$2 > k' "$tmp/restarted.log" | wc -l | awk -v n=$((steps - resumed_at)) '{ print $1 - n }')"
echo "PASS ($launcher, $backend, killed after step $logged, resumed after step $resumed_at)"
