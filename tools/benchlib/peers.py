"""The peer: the bench's workloads on torch.distributed.rpc
(tools/peer_bench.py under --python, Debian's /usr/bin/python3 with
python3-torch), each of PEERS in its own pair of processes: peer_bench.py
starts them, or with --hosts the hosts' launcher does (one per host, the
peer's TensorPipe and Gloo on the host's interface)."""
import os
import time

from .hosts import PEER_ENV
from .processes import (TOOLS_DIR, common_args, parse_json_line, run, short,
                        tail)
from .variants import PEERS


def run_peers(args, log):
    peers = {}
    script = os.path.join(TOOLS_DIR, "peer_bench.py")
    for label, extra, in_quick in PEERS:
        start = time.time()
        if args.no_peer:
            peers[label] = {"status": "n/a: --no_peer"}
            continue
        if args.quick and not in_quick:
            peers[label] = {"status": "n/a: not in quick mode"}
            continue
        if not os.path.exists(args.python):
            peers[label] = {"status": "n/a: no %s (scripts/bench_setup.sh "
                                      "installs python3-torch)" % args.python}
            continue
        argv = [args.python, script] + extra + common_args(args)
        env = None
        if args.hosts:
            argv = args.launcher(args.timeout) + argv + ["--launched"]
            env = PEER_ENV
        code, out, err = run(argv, args.timeout, env)
        result = parse_json_line(out) or {
            "status": "failed: exit %s: %s" % (code, tail(err))}
        peers[label] = result
        log("%-24s %-10s %5.1f s" % (label, short(result["status"]),
                                     time.time() - start))
    return peers
