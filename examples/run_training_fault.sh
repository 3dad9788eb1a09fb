#!/usr/bin/env bash
# One fault in the main job (a parameter server and two trainers) under
# tether_run, and what it costs:
#
#   run_training_fault.sh TETHER_RUN TRAIN BACKEND FAULT RECOVERY
#
# FAULT:    kill_trainer  trainer1 gets SIGKILL
#           kill_ps       the parameter server gets SIGKILL
#           stop_trainer  trainer1 gets SIGSTOP, and SIGCONT 30 s later
#                         (STOP_SECONDS in the environment changes it)
# RECOVERY: none          tether_run alone: a failure ends the job
#           world         tether_run --max_restarts=2: every worker starts
#                         again and resumes from the last checkpoint
#           rejoin        tether_run --max_restarts=2 --elastic, train
#                         --elastic: a lost trainer starts again alone and
#                         rejoins; a lost parameter server restarts the world
#
# The fault comes once trainer1 has logged a random step in [25, 60]
# (FAULT_AT in the environment picks it), or earlier (past its first
# checkpoint) once trainer2 is half done: trainer1 also saves the parameter
# server's checkpoints and may run far behind, and trainer2 must still have
# steps to run after the fault. Checkpoints every 10 steps.
# Prints the outcome and a line the table of docs/reliability.md is made of:
#
#   RESULT backend fault recovery exit=S resumed_s=T lost=N other_rate_down=R
#          other_rate_before=R
#
# resumed_s: from the fault to the victim's first step after it (for
# kill_ps, any trainer's); lost: the victim's steps logged before the fault
# that it ran again (for kill_ps, the most of either trainer);
# other_rate_down: trainer2's steps per second from the fault until then
# or until its last step, if it finished first (a trainer fault),
# other_rate_before: over the 3 s before the fault.
# "-" where a quantity does not apply (the job ended). Exits non-zero if a
# recovery that should finish the job did not, or a worker that should
# not have stopped did.
set -euo pipefail
tether_run="$(readlink -f "$1")"
train="$(readlink -f "$2")"
backend="$3"
fault="$4"
recovery="$5"
steps="${STEPS:-150}"
every=10
fault_at="${FAULT_AT:-$((25 + RANDOM % 36))}"
stop_seconds="${STOP_SECONDS:-30}"
tmp="$(TMPDIR="${TEST_TMPDIR:-${TMPDIR:-}}" mktemp -d -t fault.XXXXXX)"
what="$backend, $fault, recovery $recovery, at step $fault_at"
fail() { echo "FAIL ($what): $*" >&2; exit 1; }
show() { grep -v " step .*/$steps " "$1" | cut -c1-400 || true; }
now() { date +%s.%N; }

launcher=("$tether_run" --nproc 3)
flags=(--steps="$steps" --backend="$backend" --checkpoint_dir="$tmp/ckpt"
       --checkpoint_every=$every --loss_log="$tmp/loss.log")
case "$recovery" in
  none) ;;
  world) launcher+=(--max_restarts 2) ;;
  rejoin) launcher+=(--max_restarts 2 --elastic); flags+=(--elastic) ;;
  *) echo "unknown recovery '$recovery'" >&2; exit 2 ;;
esac
case "$fault" in
  kill_trainer|stop_trainer) victim=trainer1; victim_rank=1 ;;
  kill_ps) victim=ps; victim_rank=0 ;;
  *) echo "unknown fault '$fault'" >&2; exit 2 ;;
esac

: >"$tmp/out"
: >"$tmp/loss.log"
start=$(now)
timeout 300 "${launcher[@]}" -- "$train" "${flags[@]}" >>"$tmp/out" 2>&1 &
job=$!
deadline=$((SECONDS + 120))
fault_due() {
  awk -v at="$fault_at" -v every="$every" -v half="$((steps / 2))" '
    NF == 4 && $2 + 0 > last[$1] + 0 { last[$1] = $2 }
    END { exit !(last["trainer1"] >= at ||
                 (last["trainer1"] > every && last["trainer2"] >= half)) }
  ' "$tmp/loss.log"
}
until fault_due; do
  [ "$SECONDS" -lt "$deadline" ] || { show "$tmp/out"; fail "trainer1 never logged step $fault_at"; }
  sleep 0.02
done
fault_step="$(awk '$1 == "trainer1" && $2 + 0 > m { m = $2 + 0 } END { print m + 0 }' "$tmp/loss.log")"
what="$backend, $fault, recovery $recovery, after trainer1's step $fault_step (FAULT_AT=$fault_at)"
pid="$(sed -n "s/.*$victim: rank $victim_rank of 3, local rank $victim_rank, pid \([0-9]*\).*/\1/p" "$tmp/out" | head -1)"
[ -n "$pid" ] || { show "$tmp/out"; fail "$victim did not say its pid"; }
case "$fault" in
  kill_*) kill -KILL "$pid"; t0=$(now) ;;
  stop_trainer)
    kill -STOP "$pid"
    t0=$(now)
    sleep "$stop_seconds"
    # The launcher may have ended it meanwhile (a peer took it for lost).
    kill -CONT "$pid" 2>/dev/null || echo "$victim ended while it was stopped"
    ;;
esac
status=0
wait "$job" || status=$?
end=$(now)
show "$tmp/out"
echo "job: $(awk -v a="$start" -v b="$t0" 'BEGIN { printf "%.1f", b - a }') s to the fault, $(awk -v a="$t0" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s after it, exit $status"

# The loss log's lines: "<trainer> <step> <loss> <unix time>".
read -r resumed_s lost other_down other_before < <(
  awk -v t0="$t0" -v victim="$victim" -v steps="$steps" '
    $4 <= t0 { last[$1] = ($2 > last[$1] ? $2 : last[$1]) }
    $4 > t0 && !($1 in first) { first[$1] = $2; first_t[$1] = $4 }
    $1 == "trainer2" && $4 > t0 - 3 && $4 <= t0 { before++ }
    { all[NR] = $0 }
    END {
      # When training resumed: the victim trainer'"'"'s first step after the
      # fault; for the parameter server, the first of either trainer.
      resumed = ""; lost = 0
      for (t in first) {
        if (victim == "ps" || t == victim) {
          if (resumed == "" || first_t[t] < resumed) resumed = first_t[t]
          l = last[t] - (first[t] - 1); if (l > lost) lost = l
        }
      }
      if (resumed == "") { print "-", "-", "-", before / 3; exit }
      # trainer2 may finish its steps before trainer1 is back: then its
      # rate is over the time it trained.
      down = 0; until = resumed
      for (i = 1; i <= NR; i++) {
        split(all[i], f, " ")
        if (f[1] == "trainer2" && f[4] > t0 && f[4] <= resumed) {
          down++; if (f[2] == steps) until = f[4]
        }
      }
      printf "%.2f %d %s %.1f\n", resumed - t0, lost,
             (victim == "ps" ? "-" : sprintf("%.1f", down / (until - t0))), before / 3
    }' "$tmp/loss.log")
echo "RESULT $backend $fault $recovery exit=$status resumed_s=$resumed_s lost=$lost other_rate_down=$other_down other_rate_before=$other_before"

# What each recovery must do.
starts() { grep -c "$1: rank $2 of 3" "$tmp/out" || true; }
case "$fault:$recovery" in
  kill_*:none)
    [ "$status" -ne 0 ] || fail "the job survived a SIGKILL without a restart"
    ;;
  stop_trainer:*)
    # Whether a peer takes the stopped trainer for lost is the backend's
    # (gRPC's keepalive does within 15 s: docs/reliability.md); if the job
    # finished in one go, trainer1 was not restarted.
    if [ "$status" -eq 0 ] && ! grep -q "tether_run: restart" "$tmp/out"; then
      [ "$(starts trainer1 1)" -eq 1 ] || fail "trainer1 was restarted after a stop"
    fi
    ;;
  kill_trainer:world|kill_ps:world|kill_ps:rejoin)
    [ "$status" -eq 0 ] || fail "the job did not finish after a restart of the world"
    grep -q "tether_run: restart 1 of 2: rank $victim_rank killed by signal 9 (Killed); starting all 3 workers again" "$tmp/out" ||
      fail "tether_run did not restart the world"
    [ "$(starts ps 0)" -eq 2 ] && [ "$(starts trainer2 2)" -eq 2 ] || fail "not every worker started twice"
    ;;
  kill_trainer:rejoin)
    [ "$status" -eq 0 ] || fail "the job did not finish after trainer1 rejoined"
    grep -q "tether_run: restart 1 of 2: rank 1 killed by signal 9 (Killed); starting rank 1 alone again" "$tmp/out" ||
      fail "tether_run did not restart trainer1 alone"
    [ "$(starts ps 0)" -eq 1 ] || fail "the parameter server was restarted"
    [ "$(starts trainer2 2)" -eq 1 ] || fail "trainer2 was restarted"
    [ "$(starts trainer1 1)" -eq 2 ] || fail "trainer1 did not start twice"
    grep -q "trainer1: rejoined, resumed from the checkpoint of step" "$tmp/out" ||
      fail "trainer1 did not resume from its checkpoint"
    grep -q "trainer2 summary: $steps steps" "$tmp/out" || fail "trainer2 did not run every step in one go"
    # Every step of each trainer logged, the steps after the checkpoint twice
    # for trainer1.
    for t in trainer1 trainer2; do
      [ "$(awk -v t=$t '$1 == t { print $2 }' "$tmp/loss.log" | sort -un | wc -l)" -eq "$steps" ] ||
        fail "$t did not log every step"
    done
    [ "$other_down" != "-" ] && awk -v r="$other_down" 'BEGIN { exit !(r > 0) }' ||
      fail "trainer2 made no progress while trainer1 was down"
    ;;
esac
case "$recovery:$status" in
  world:0|rejoin:0)
    grep -q "ps: all trainers done" "$tmp/out" || fail "the parameter server did not finish"
    for t in trainer1 trainer2; do
      [ "$(awk -v t=$t '$1 == t { print $2 }' "$tmp/loss.log" | sort -un | tail -1)" -eq "$steps" ] ||
        fail "$t did not reach step $steps"
    done
    ;;
esac
echo "PASS ($what)"
