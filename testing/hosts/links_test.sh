#!/usr/bin/env bash
# Two workers on one simulated host and a third on another
# (testing/hosts/hosts.sh): every pair calls, and the tensorpipe backend's
# negotiation must pick its fast channel within the host and the network
# between the hosts, as Agent::link_to reports:
#   w0 <-> w1 (host 0): channel cma_write    w0/w1 <-> w2: channel basic
# Other backends have one way for every pair: the calls must work.
#   links_test.sh BACKEND HOSTS_WORKER
set -uo pipefail
backend="$1"
worker="$(realpath "$2")"
here="$(dirname "$(realpath "$0")")"
source "$here/hosts.sh"
out="${TEST_TMPDIR:-/tmp}/links_$$"
mkdir -p "$out"
hosts_setup 2 || exit 1
port=$((20000 + RANDOM % 20000))
host_of=(0 0 1)
pids=()
for rank in 2 1 0; do
  hosts_run "${host_of[$rank]}" env RANK="$rank" WORLD_SIZE=3 \
    MASTER_ADDR="$(hosts_addr 0)" MASTER_PORT="$port" \
    TETHER_TEST_BACKEND="$backend" timeout 120 "$worker" \
    > "$out/rank$rank.log" 2>&1 &
  pids+=($!)
done
failures=0
for pid in "${pids[@]}"; do wait "$pid" || failures=$((failures + 1)); done
for rank in 0 1 2; do sed "s/^/[w$rank on host ${host_of[$rank]}] /" "$out/rank$rank.log"; done
expect() {  # expect FROM TO CHANNEL
  if grep -q "^link w$1 -> w$2: transport tcp, channel $3$" "$out/rank$1.log"; then
    echo "ok: w$1 -> w$2 over $3"
  else
    echo "FAILED: w$1 -> w$2 not over channel $3"
    failures=$((failures + 1))
  fi
}
if [ "$backend" = tensorpipe ]; then
  # cma_write needs ptrace permission between the two processes (the
  # kernel's yama policy); where it is refused TensorPipe's own cma is not
  # viable either and basic is all there is.
  same_host=cma_write
  scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2> /dev/null || echo 0)
  [ "$scope" -le 0 ] || same_host=basic
  expect 0 1 "$same_host"
  expect 1 0 "$same_host"
  for pair in "0 2" "2 0" "1 2" "2 1"; do expect $pair basic; done
fi
echo "$backend: $failures failure(s)"
[ "$failures" -eq 0 ]
