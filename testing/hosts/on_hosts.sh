#!/usr/bin/env bash
# on_hosts: a launcher that runs each rank of a world on a simulated host of
# its own (hosts.sh beside this file), so that the ranks meet over the
# network path (a veth pair and a bridge), never loopback, shared memory or
# cross-memory attach.
#
#   on_hosts.sh [--timeout S] N -- PROGRAM ARGS...
#
# Sets up N hosts and runs PROGRAM on each (in this working directory),
# rank r on host r, with RANK=r, LOCAL_RANK=0, WORLD_SIZE=N, MASTER_ADDR=
# host 0's address and MASTER_PORT (29500: every host's network is new, so
# the port is free), as a cluster launcher sets them; rank 0 serves the
# rendezvous store (no TORCHELASTIC_USE_AGENT_STORE). Each host's network
# interface is eth0 (for FI_TCP_IFACE or TP_SOCKET_IFNAME).
# Once every rank has ended, their output is printed line by line, prefixed
# by rank ("[r] ", as tools/tether_run prints it): stdout on stdout, stderr
# on stderr. A rank that fails (non-zero exit, or killed after --timeout
# seconds) ends the others; the exit status is the first failed rank's.
# Where namespaces cannot be made here it says why on stderr and exits 77.
# The hosts are deleted on every exit, a signal's too.
set -uo pipefail
here="$(dirname "$(realpath "$0")")"
source "$here/hosts.sh"

usage() {
  echo "usage: on_hosts.sh [--timeout S] N -- PROGRAM ARGS..." >&2
  exit 2
}

timeout_s=0
if [ "${1:-}" = --timeout ]; then
  [[ "${2:-}" =~ ^[0-9]+$ ]] || usage
  timeout_s="$2"
  shift 2
fi
[[ "${1:-}" =~ ^[1-9][0-9]*$ ]] && [ "${2:-}" = -- ] && [ $# -ge 3 ] || usage
n="$1"
shift 2

HOSTS_SKIP_STATUS=77
exec 3>&1
hosts_setup "$n" >&2 || exit 1
out="$(mktemp -d "${TMPDIR:-/tmp}/on_hosts.XXXXXX")"
print_and_clean_up() {
  local r
  for ((r = 0; r < n; ++r)); do
    [ -f "$out/$r.out" ] && sed "s/^/[$r] /" "$out/$r.out" >&3
    [ -f "$out/$r.err" ] && sed "s/^/[$r] /" "$out/$r.err" >&2
  done
  rm -rf "$out"
  hosts_cleanup
}
trap print_and_clean_up EXIT

bound=()
if [ "$timeout_s" -gt 0 ]; then
  bound=(timeout --kill-after=5 "$timeout_s")
fi
declare -A rank_of
for ((r = n - 1; r >= 0; --r)); do
  hosts_run "$r" env -C "$PWD" RANK="$r" LOCAL_RANK=0 WORLD_SIZE="$n" \
    MASTER_ADDR="$(hosts_addr 0)" MASTER_PORT=29500 \
    "${bound[@]}" "$@" > "$out/$r.out" 2> "$out/$r.err" &
  rank_of[$!]=$r
done
status=0
for ((left = n; left > 0; --left)); do
  wait -n -p pid
  code=$?
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$code
    echo "on_hosts: rank ${rank_of[$pid]} failed with status $code" >&2
    # Ending a host's init ends every process on that host.
    hosts_cleanup
  fi
done
exit "$status"
