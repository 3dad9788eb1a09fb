#!/usr/bin/env bash
# The main job (examples/train: a parameter server and two trainers) under a
# launcher users already have, which tether does not ship:
#
#   run_training_launcher_test.sh mpirun   TRAIN WORKERS_PY   Open MPI (openmpi-bin)
#   run_training_launcher_test.sh torchrun TRAIN WORKERS_PY   torchrun (python3-torch)
#
# Each process reads its rank, world size and local rank from the launcher's
# own variables (core/rendezvous.h, launcher_env). Under mpirun, rank 0
# serves the rendezvous store on MASTER_PORT; under torchrun, its agent
# already does (TORCHELASTIC_USE_AGENT_STORE=True) and rank 0 connects to it.
set -euo pipefail
launcher="$1"
train="$(readlink -f "$2")"
steps=40

# A port free now, for the store (mpirun) or torchrun's agent, chosen where
# no server binding port 0 can take it first (workers.py, free_port).
port="$(/usr/bin/python3 "$3")"

case "$launcher" in
  mpirun)
    as_root=()
    if [ "$(id -u)" -eq 0 ]; then as_root=(--allow-run-as-root); fi
    # --oversubscribe: 3 processes on a 2-core machine.
    cmd=(mpirun "${as_root[@]}" --oversubscribe -np 3
         -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port"
         "$train" --steps=$steps)
    ;;
  torchrun)
    # --redirects 1 --tee 1: torch 1.13's torchrun on Python 3.11 cannot parse
    # its default ("0": Std.NONE is no longer iterated) and fails before
    # starting anything; teeing stdout works.
    cmd=(/usr/bin/python3 -m torch.distributed.run --nproc_per_node 3
         --master_addr 127.0.0.1 --master_port "$port"
         --redirects 1 --tee 1 --no_python "$train" --steps=$steps)
    ;;
  *)
    echo "usage: $0 mpirun|torchrun TRAIN WORKERS_PY" >&2
    exit 2
    ;;
esac

start=$(date +%s%N)
status=0
out="$(timeout 300 "${cmd[@]}" 2>&1)" || status=$?
echo "$out" | grep -v " step .*/$steps " || true
echo "$launcher run took $(( ($(date +%s%N) - start) / 1000000 )) ms, exit $status"
fail() { echo "FAIL ($launcher): $*" >&2; exit 1; }
[ "$status" -eq 0 ] || fail "the job exited with $status"
for who in "ps: rank 0 of 3, local rank 0" \
           "trainer1: rank 1 of 3, local rank 1" \
           "trainer2: rank 2 of 3, local rank 2" \
           "trainer1 summary: $steps steps" \
           "trainer2 summary: $steps steps" \
           "ps: all trainers done"; do
  grep -q "$who" <<<"$out" || fail "no line '$who'"
done
echo "PASS ($launcher)"
