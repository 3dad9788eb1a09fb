#!/usr/bin/env bash
# A network partition during the main job (examples/train) across 3
# simulated hosts (testing/hosts/hosts.sh): the parameter server on host 0,
# trainers on hosts 1 and 2. Once the trainers are under way, trainer2's
# cable is pulled (its port on the bridge goes down: its packets vanish, its
# process lives on) for DOWN seconds, then plugged back.
#   DOWN shorter than the peer timeout: training goes on; every rank ends
#     well (no call fails: each call's own timeout is 60 s).
#   DOWN longer than the peer timeout: every rank fails within twice the
#     peer timeout plus BOUND seconds of the cut, naming the worker it lost
#     (trainer2 names ps, ps names trainer2, trainer1 names trainer2 or
#     ps, which ended when it lost trainer2). Twice: the cut-off trainer's
#     call fails within one peer timeout, then its join's store request
#     (rank 0's host serves the store) within another.
# Prints, for each rank, when (after the cut) its first error showed and
# when it exited; and how much longer trainer2 took than trainer1.
#   partition_test.sh BACKEND TRAIN DOWN_S PEER_TIMEOUT_MS [BOUND_S]
set -uo pipefail
backend="$1"
train="$(realpath "$2")"
down_s="$3"
peer_timeout_ms="$4"
bound_s="${5:-8}"
here="$(dirname "$(realpath "$0")")"
source "$here/hosts.sh"
out="${TEST_TMPDIR:-/tmp}/partition_$$"
mkdir -p "$out"
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# Each line with the time it came, in ms: "<ms> <line>".
stamp() {
  local line
  while IFS= read -r line; do
    printf '%s %s\n' "$(now_ms)" "$line"
  done
}
seconds() { echo "$(($1 / 1000)).$(printf %03d $(($1 % 1000)))"; }
peer_timeout_s=$((peer_timeout_ms / 1000))
long=0
[ "$down_s" -gt "$peer_timeout_s" ] && long=1
# Long enough to outlast the cut: the trainers run some 50 steps a second.
steps=$((50 * (down_s + 12)))

hosts_setup 3 || exit 1
port=$((20000 + RANDOM % 20000))
pids=()
for rank in 2 1 0; do
  (
    hosts_run "$rank" env RANK="$rank" WORLD_SIZE=3 \
      MASTER_ADDR="$(hosts_addr 0)" MASTER_PORT="$port" \
      timeout 300 "$train" --backend="$backend" --steps="$steps" \
      --peer_timeout_ms="$peer_timeout_ms" 2>&1 | stamp > "$out/rank$rank.log"
    echo "${PIPESTATUS[0]} $(now_ms)" > "$out/rank$rank.end"
  ) &
  pids+=($!)
done
# The cut, once trainer2 has shown progress (bounded wait).
for ((tries = 0; tries < 600; ++tries)); do
  grep -q "trainer2 \[" "$out/rank2.log" 2> /dev/null && break
  sleep 0.05
done
cut_ms=$(now_ms)
hosts_link_down 2
echo "cut trainer2's host off for ${down_s} s (peer timeout ${peer_timeout_ms} ms)"
sleep "$down_s"
hosts_link_up 2
for pid in "${pids[@]}"; do wait "$pid"; done

failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
names=(ps trainer1 trainer2)
for rank in 0 1 2; do
  cut -d' ' -f2- "$out/rank$rank.log" | grep -v " step " |
    sed "s/^/[${names[$rank]} on host $rank] /"
done
took() { sed -n "s/.*$1 summary: [0-9]* steps in \([0-9.]*\) s.*/\1/p" "$out/rank${2}.log"; }
if [ -n "$(took trainer1 1)" ] && [ -n "$(took trainer2 2)" ]; then
  echo "trainer2 took $(awk -v a="$(took trainer2 2)" -v b="$(took trainer1 1)" \
    'BEGIN { printf "%.2f", a - b }') s longer than trainer1"
fi
for rank in 0 1 2; do
  read -r rc end_ms < "$out/rank$rank.end"
  after_ms=$((end_ms - cut_ms))
  first=$(grep -m1 -E "UNAVAILABLE|DEADLINE_EXCEEDED|FAILED" "$out/rank$rank.log" |
    cut -d' ' -f1)
  shown="no error"
  [ -n "$first" ] && shown="first error $(seconds $((first - cut_ms))) s"
  echo "${names[$rank]}: $shown, exit $rc $(seconds "$after_ms") s after the cut"
  if [ "$long" -eq 0 ]; then
    [ "$rc" -eq 0 ] || fail "${names[$rank]} failed after a ${down_s} s cut"
  else
    # trainer2 loses ps; ps loses trainer2; trainer1 loses trainer2 (at
    # its shutdown) or ps (which ended when it lost trainer2).
    lost="'trainer2'"
    [ "$rank" -eq 2 ] && lost="'ps'"
    [ "$rank" -eq 1 ] && lost="'trainer2'\|'ps'"
    [ "$rc" -ne 0 ] || fail "${names[$rank]} ended well while cut off for ${down_s} s"
    grep -q "$lost" "$out/rank$rank.log" ||
      fail "${names[$rank]}'s error does not name $lost"
    [ "$after_ms" -le $((2 * peer_timeout_ms + bound_s * 1000)) ] ||
      fail "${names[$rank]} ended $after_ms ms after the cut, over 2 x ${peer_timeout_ms} ms + ${bound_s} s"
  fi
done
echo "$backend, cut ${down_s} s, peer timeout ${peer_timeout_ms} ms: $failures failure(s)"
[ "$failures" -eq 0 ]
