#!/usr/bin/env bash
# The main job (examples/train) across simulated hosts (testing/hosts/hosts.sh):
# the parameter server and each trainer on a host of its own, MASTER_ADDR the
# first host's address, no address setting (each worker advertises the
# address of its route to the rendezvous, core/host_address.h). Checks:
#   1. ps + 1 trainer on 2 hosts: every step's loss equals single-process
#      LibTorch training (examples/train's own check);
#   2. ps + 2 trainers on 3 hosts: both train (the loss goes down) and
#      their mean last loss is within 3% of the same job's on one machine
#      over loopback.
#   train_hosts_test.sh BACKEND TRAIN TETHER_RUN [STEPS]
set -uo pipefail
backend="$1"
train="$(realpath "$2")"
tether_run="$(realpath "$3")"
steps="${4:-40}"
here="$(dirname "$(realpath "$0")")"
source "$here/hosts.sh"
out="${TEST_TMPDIR:-/tmp}/train_hosts_$$"
mkdir -p "$out"

# The summary's last loss: "... loss 3.1 -> 2.5 (mean ..." -> 2.5
last_loss() { sed -n 's/.* -> \([0-9.]*\) (mean.*/\1/p' "$1" | head -1; }
mean_last_loss() {
  awk -v a="$(last_loss "$1")" -v b="$(last_loss "$2")" \
    'BEGIN { if (a == "" || b == "") print "none"; else printf "%.4f\n", (a + b) / 2 }'
}

# Runs the job on hosts 0 .. N-1 (rank = host), bounded; 0 if every rank
# exited 0. Logs in $out/<tag>_rank<R>.log.
run_on_hosts() {
  local tag="$1" n="$2" rank pids=() rc=0
  local port=$((20000 + RANDOM % 20000))
  for ((rank = n - 1; rank >= 0; --rank)); do
    hosts_run "$rank" env RANK="$rank" WORLD_SIZE="$n" \
      MASTER_ADDR="$(hosts_addr 0)" MASTER_PORT="$port" \
      timeout 240 "$train" --backend="$backend" --steps="$steps" \
      > "$out/${tag}_rank$rank.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for ((rank = 0; rank < n; ++rank)); do
    sed "s/^/[$tag host $rank] /" "$out/${tag}_rank$rank.log"
  done
  return "$rc"
}

echo "== loopback: 3 processes on one machine"
if ! "$tether_run" --nproc 3 -- "$train" --backend="$backend" \
    --steps="$steps" > "$out/loopback.log" 2>&1; then
  cat "$out/loopback.log"
  echo "FAILED: the loopback run"
  exit 1
fi
cat "$out/loopback.log"
grep "trainer1 summary" "$out/loopback.log" > "$out/loopback_t1.log"
grep "trainer2 summary" "$out/loopback.log" > "$out/loopback_t2.log"

hosts_setup 3 || exit 1
failures=0
echo "== 2 hosts: ps on $(hosts_addr 0), trainer1 on $(hosts_addr 1)"
if run_on_hosts pair 2 &&
    grep -q "trainer1 check: every step's loss matches" "$out/pair_rank1.log"; then
  echo "ok: across 2 hosts, every step's loss matches LibTorch's"
else
  echo "FAILED: the job across 2 hosts"
  failures=$((failures + 1))
fi

echo "== 3 hosts: ps, trainer1, trainer2"
if run_on_hosts three 3 && grep -q "ps: all trainers done" "$out/three_rank0.log"; then
  # Which trainer's update lands first differs from run to run, and so does
  # each trainer's own loss (by up to 5%); their mean does not (0.3%).
  here_loss=$(mean_last_loss "$out/three_rank1.log" "$out/three_rank2.log")
  there_loss=$(mean_last_loss "$out/loopback_t1.log" "$out/loopback_t2.log")
  if awk -v a="$here_loss" -v b="$there_loss" \
      'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 0.03 * b) }'; then
    echo "ok: the trainers' mean last loss $here_loss across hosts, $there_loss on loopback"
  else
    echo "FAILED: the trainers' mean last loss '$here_loss' across hosts, '$there_loss' on loopback"
    failures=$((failures + 1))
  fi
else
  echo "FAILED: the job across 3 hosts"
  failures=$((failures + 1))
fi
echo "$backend: $failures failure(s)"
[ "$failures" -eq 0 ]
