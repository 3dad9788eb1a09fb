"""--hosts: the two processes of every run on two simulated hosts.

testing/hosts/on_hosts.sh (hosts.sh's network namespaces on a bridge, each
host with its own pid, mount and uts namespaces) runs rank 0 on host 0 and
rank 1 on host 1, with MASTER_ADDR host 0's address: what is timed is the
network path (veth pairs and a bridge), never loopback, shared memory or
cross-memory attach. It needs root, `ip`, `unshare` and `nsenter`; where
namespaces cannot be made the bench says why and exits non-zero.
"""
import os

from .processes import TOOLS_DIR, run, tail

# Each simulated host's network interface (testing/hosts/hosts.sh).
HOSTS_IFACE = "eth0"
# bench_worker --raw (raw TCP, TensorPipe's pipe alone, memcpy) listens
# where tether's backends do (tools/internal/launcher_env.h:
# listen_address()); the external baselines listen on 127.0.0.1
# (tools/internal/grpc_echo.h, tools/fabric_pingpong.cc): not across hosts.
BASELINES_NOT_ACROSS = "n/a: not across hosts (it listens on 127.0.0.1 only)"
# The peer's TensorPipe (uv) and Gloo find their address from these; without
# them, with no name for the host, they fall back to 127.0.0.1.
PEER_ENV = {"TP_SOCKET_IFNAME": HOSTS_IFACE, "GLOO_SOCKET_IFNAME": HOSTS_IFACE}


def launcher_script():
    """testing/hosts/on_hosts.sh, beside tools/ in the workspace or the
    runfiles (//tools:bench's data)."""
    return os.path.join(os.path.dirname(TOOLS_DIR), "testing", "hosts",
                        "on_hosts.sh")


def launcher(script, timeout):
    """The command prefix that starts a two-process tool across the hosts;
    on_hosts ends the ranks 10 s before the bench's own `timeout`, so their
    output is kept."""
    return [script, "--timeout", str(max(1, timeout - 10)), "2", "--"]


def placed_env(env):
    """A variant's environment across hosts: an interface pinned to
    loopback is pinned to the host's network interface instead."""
    return {k: HOSTS_IFACE if k == "FI_TCP_IFACE" and v == "lo" else v
            for k, v in env.items()}


def check_hosts(log):
    """on_hosts.sh's path once it has set up two hosts and run a command on
    each; None, having said why, where it cannot."""
    script = launcher_script()
    if not os.access(script, os.X_OK):
        log("bench: --hosts: %s is missing" % script)
        return None
    code, out, err = run(launcher(script, 60) + ["true"], 60)
    if code != 0:
        log("bench: --hosts: no simulated hosts here (on_hosts.sh exit %s): %s"
            % (code, tail(err + out)))
        return None
    return script
