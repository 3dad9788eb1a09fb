#!/usr/bin/env bash
# Every fault x recovery x backend of run_training_fault.sh, ROUNDS times
# each (1 unless set), and their RESULT lines: the table of faults in
# docs/reliability.md. About 25 minutes on 2 cores with ROUNDS=1.
#
#   run_training_faults.sh RUN_TRAINING_FAULT TETHER_RUN TRAIN
set -uo pipefail
one="$1"
tether_run="$2"
train="$3"
rounds="${ROUNDS:-1}"
failed=0
results=()
for backend in ${BACKENDS:-tensorpipe grpc libfabric}; do
  for fault in kill_trainer kill_ps stop_trainer; do
    for recovery in none world rejoin; do
      for round in $(seq 1 "$rounds"); do
        out="$("$one" "$tether_run" "$train" "$backend" "$fault" "$recovery" 2>&1)"
        status=$?
        line="$(grep "^RESULT " <<<"$out")"
        echo "${line:-RESULT $backend $fault $recovery (none)} round=$round status=$status"
        results+=("$line")
        if [ "$status" -ne 0 ]; then
          failed=1
          tail -20 <<<"$out"
        fi
      done
    done
  done
done
exit "$failed"
