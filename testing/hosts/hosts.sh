# Simulated hosts for tests: source this file, then
#
#   hosts_setup N        N "hosts" (0 .. N-1) on one bridge; where namespaces
#                        cannot be made here it says why ("SKIP: ...") and
#                        exits with HOSTS_SKIP_STATUS (0, a passed test,
#                        unless the caller sets it: on_hosts.sh fails)
#   hosts_addr I         host I's address (10.x.y.(I+1), a /24 of its own)
#   hosts_run I CMD...   runs CMD on host I, in the foreground
#   hosts_link_down I    pulls host I's cable (its port on the bridge goes
#   hosts_link_up I      down: packets to and from it vanish) / plugs it back
#
# Each host is a network namespace with its own address on a bridge (the
# bridge lives in a namespace of its own too: nothing changes outside the
# namespaces made here), and a process that holds its own pid, mount and uts
# namespaces: its own /dev/shm (a tmpfs), its own process ids and its own
# host name (tether-host<I>). So what only works within one machine (shared
# memory, cross-memory attach, abstract unix sockets) cannot silently work
# between two hosts: a backend has to find the network. Commands run on a
# host with nsenter into those namespaces; several commands on one host
# share them, as processes on one machine do.
#
# Cleanup runs on exit, a signal's too (hosts_cleanup, set as the EXIT trap
# by hosts_setup):
# it kills each host's processes (ending the host's pid namespace ends
# everything in it) and deletes the namespaces. Needs root (CAP_NET_ADMIN,
# CAP_SYS_ADMIN), `ip` (iproute2), `unshare` and `nsenter` (util-linux).
# docs/architecture.md section 9 says how a backend's test uses it.

_hosts_id=$$
_hosts_n=0
_hosts_net=""
_hosts_switch=""
_hosts_inits=()

hosts_skip() {
  echo "SKIP: $*"
  exit "${HOSTS_SKIP_STATUS:-0}"
}

_hosts_ns() { echo "tether_h$1_${_hosts_id}"; }
_hosts_port() { echo "th$((_hosts_id % 100000))p$1"; }

hosts_addr() { echo "${_hosts_net}.$(($1 + 1))"; }

hosts_cleanup() {
  local i
  for ((i = 0; i < _hosts_n; ++i)); do
    if [ -n "${_hosts_inits[$i]:-}" ]; then
      kill -KILL "${_hosts_inits[$i]}" 2> /dev/null
    fi
  done
  for ((i = 0; i < _hosts_n; ++i)); do
    ip netns del "$(_hosts_ns "$i")" 2> /dev/null
  done
  [ -n "$_hosts_switch" ] && ip netns del "$_hosts_switch" 2> /dev/null
  return 0
}

# The pid of the process that holds host $1's namespaces (a child of the
# `unshare` started for it), once it has set its host up; bounded wait.
_hosts_wait_init() {
  local unshare_pid="$1" ready="$2" child="" tries
  for ((tries = 0; tries < 100; ++tries)); do
    child=$(cat "/proc/$unshare_pid/task/$unshare_pid/children" 2> /dev/null)
    child="${child%% *}"
    if [ -n "$child" ] && [ -e "$ready" ]; then
      echo "$child"
      return 0
    fi
    sleep 0.05
  done
  return 1
}

hosts_setup() {
  local n="$1" i ns port err
  for tool in ip unshare nsenter; do
    command -v "$tool" > /dev/null || hosts_skip "'$tool' is not installed"
  done
  [ "$(id -u)" -eq 0 ] || hosts_skip "simulated hosts need root"
  _hosts_net="10.$((200 + _hosts_id % 50)).$((_hosts_id / 50 % 250))"
  _hosts_switch="tether_sw_${_hosts_id}"
  trap hosts_cleanup EXIT
  # bash runs no EXIT trap when a signal ends it (Bazel's timeout sends
  # SIGTERM): exit on one, and the EXIT trap cleans up.
  trap 'exit 143' TERM INT HUP
  if ! err=$(ip netns add "$_hosts_switch" 2>&1); then
    _hosts_switch=""
    hosts_skip "cannot create network namespaces here: $err"
  fi
  set -e
  ip -n "$_hosts_switch" link add br0 type bridge
  ip -n "$_hosts_switch" link set br0 up
  ip -n "$_hosts_switch" link set lo up
  for ((i = 0; i < n; ++i)); do
    ns=$(_hosts_ns "$i")
    port=$(_hosts_port "$i")
    ip netns add "$ns"
    _hosts_n=$((i + 1))
    ip -n "$_hosts_switch" link add "$port" type veth peer name eth0 netns "$ns"
    ip -n "$_hosts_switch" link set "$port" master br0 up
    ip -n "$ns" addr add "$(hosts_addr "$i")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  done
  set +e
  local tmp="${TEST_TMPDIR:-/tmp}"
  for ((i = 0; i < n; ++i)); do
    ns=$(_hosts_ns "$i")
    local ready="$tmp/hosts_${_hosts_id}_$i.ready"
    rm -f "$ready"
    # The host's init: its own pid, mount and uts namespaces, a fresh /proc
    # and /dev/shm, its name; then it waits to be killed with the host.
    ip netns exec "$ns" unshare --pid --mount --uts --fork --kill-child \
      --mount-proc sh -c "mount -t tmpfs -o size=512m tmpfs /dev/shm &&
        hostname tether-host$i && touch '$ready' && exec sleep 100000" \
      2>> "$tmp/hosts_${_hosts_id}.log" &
    local init
    if ! init=$(_hosts_wait_init "$!" "$ready"); then
      echo "FAILED: host $i did not come up" >&2
      return 1
    fi
    _hosts_inits[$i]="$init"
    rm -f "$ready"
  done
  return 0
}

hosts_run() {
  local i="$1"
  shift
  nsenter --target "${_hosts_inits[$i]}" --net --pid --mount --uts -- "$@"
}

hosts_link_down() {
  ip -n "$_hosts_switch" link set "$(_hosts_port "$1")" down
}

hosts_link_up() {
  ip -n "$_hosts_switch" link set "$(_hosts_port "$1")" up
}
