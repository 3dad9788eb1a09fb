#!/usr/bin/env bash
# A peer made unreachable while its process lives: two workers in
# two network namespaces joined by a veth pair; rank 0 takes rank 1's end of
# the link down and up again (testing/netns/netns_worker.cc says what is
# checked). Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and `ip`; where those
# are missing it says so and skips.
#   netns_test.sh WORKER_BINARY
set -uo pipefail
worker="$1"
if ! command -v ip > /dev/null; then
  echo "SKIP: the 'ip' command (iproute2) is not installed"
  exit 0
fi
id=$$
ns_a="tether_a_$id"
ns_b="tether_b_$id"
veth_a="tva$((id % 100000))"
veth_b="tvb$((id % 100000))"
net="10.$((200 + id % 50)).$((id / 50 % 250)).0"
addr_a="${net%.0}.1"
addr_b="${net%.0}.2"
cleanup() {
  ip netns del "$ns_a" 2> /dev/null
  ip netns del "$ns_b" 2> /dev/null
}
trap cleanup EXIT
if ! ip netns add "$ns_a" 2> /tmp/netns_err_$id; then
  echo "SKIP: cannot create network namespaces here: $(cat /tmp/netns_err_$id)"
  rm -f /tmp/netns_err_$id
  exit 0
fi
rm -f /tmp/netns_err_$id
set -e
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up
set +e

port=$((20000 + id % 20000))
common=(env WORLD_SIZE=2 MASTER_ADDR="$addr_a" MASTER_PORT="$port")
ip netns exec "$ns_b" "${common[@]}" RANK=1 LISTEN_ADDR="$addr_b" \
  "$worker" > "${TEST_TMPDIR:-/tmp}/netns_rank1.log" 2>&1 &
rank1=$!
ip netns exec "$ns_a" "${common[@]}" RANK=0 LISTEN_ADDR="$addr_a" \
  PEER_LINK_DOWN="ip -n $ns_b link set $veth_b down" \
  PEER_LINK_UP="ip -n $ns_b link set $veth_b up" \
  timeout 180 "$worker"
rc0=$?
wait "$rank1"
rc1=$?
sed 's/^/[rank 1] /' "${TEST_TMPDIR:-/tmp}/netns_rank1.log"
echo "rank 0 exited with $rc0, rank 1 with $rc1"
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ]
