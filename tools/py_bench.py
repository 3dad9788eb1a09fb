#!/usr/bin/python3
"""py_bench: tether from Python beside torch.distributed.rpc (the peer).

The same Python program on both: rank 0 calls rank 1 in another local
process; only the module differs (tether.rpc or torch.distributed.rpc).

    /usr/bin/python3 tools/py_bench.py [--quick] [--backend tensorpipe]
        [--transports shm,tcp] [--rounds 3] [--workloads sync,async]
        [--busy_poll_us 100] [--spare_core_poll_us 0] [--idle_s 5]
        [--out results.json] [--plot py_bench.png]

--rounds runs tether and the peer alternately that many times each
(tether, peer, tether, peer, ...) and reports each side's median over its
rounds, so that the load of a shared machine weighs on both alike; every
round's numbers are printed too. --workloads keeps the workloads whose
names contain one of its words (default: all).

--transports sets tether's "tensorpipe.transports" (default: the backend's,
the guarded tcp); the peer always runs its default transports, which
between two local processes are shm. --busy_poll_us gives tether's
workers RpcBackendOptions(busy_poll=...) (default 0: off), and
--spare_core_poll_us RpcBackendOptions(spare_core_poll=...) (default: the
library's, 100 us; 0: waiting threads sleep at once).

With "rpc_sync builtin" it also measures the floor of any RPC between
the two processes that does not poll: a plain Python TCP ping-pong of 16
bytes each way (blocking sockets, TCP_NODELAY, no RPC), each side asleep
in recv() until the other's bytes come, in each round, and prints it
under the table beside 1/5 of the peer's rpc_sync builtin.

CPU: beside each workload, the CPU time (user + system, every thread of
both processes; tools/benchlib/python_rpc.py) per call over its measured
calls; and, after all of them, each process's idle CPU over --idle_s
seconds (5; 2 with --quick) with no calls, in % of a core. --out FILE
writes every round's numbers as JSON; --plot FILE draws tether's speed over
the peer's per workload, CPU per call and idle CPU, tether beside the peer,
as a PNG.

Needs `import tether` (scripts/python_setup.sh). Prints one table; each
workload is a median over N calls (p99 beside it), timed in rank 0:
  rpc_sync builtin   rpc_sync(torch.add, (2-float tensor, 1))
  rpc_sync python    rpc_sync(py_add, (2-float tensor, 1)), a function of
                     the script's __main__ (tether: by reference; the peer:
                     pickled)
  rpc_sync object    rpc_sync(echo, (Observation(...),)): an object of the
                     script's class holding a 4-float numpy array, an int
                     and a 2-float tensor, sent and returned by value
                     (pickled on both; tether lifts the tensor out and
                     unpickles under the receiver's policy)
  rpc_async + wait   rpc_async(torch.add, (2-float tensor, 1)).wait(), one
                     call at a time (the peer's examples' way)
  rpc_async builtin  calls per second, 64 in flight
  remote + to_here   rpc.remote(torch.add, ...).to_here()
  dist autograd step a distributed autograd context around a forward of a
                     Linear(256, 256) that rank 1 holds (an RRef made by
                     rpc.remote, called through rref.rpc_sync()) on a
                     64x256 input that requires grad, dist_autograd.backward
                     of its sum, get_gradients, and the context's exit (the
                     workload of tools/peer_bench.py and the C++ bench)
  echo 64 MiB        rpc_sync(echo, (64 MiB uint8 tensor,)), a function of
                     the script's __main__ returning its argument; GB/s
                     counts both ways. With THP_MEM_ALLOC_ENABLE=1 in the
                     environment tether puts the tensor on huge pages
                     (core/huge_pages.h); the peer's LibTorch here (1.13)
                     does not read it.
"""
import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import time

from benchlib.python_rpc import (  # beside this script
    CpuUse, autograd_step, free_port, percentile)

rpc = None


def py_add(a, b):
    return a + b


def echo(x):
    return x


class Observation:
    """A small object of the program's own class, sent by value."""

    def __init__(self, state, step, reward):
        self.state, self.step, self.reward = state, step, reward


def make_linear():
    import torch
    return torch.nn.Linear(256, 256)


def timed(n, call, cpu=None):
    """p50 and p99 of n calls after a warm-up; with `cpu` (a CpuUse), both
    processes' CPU per call over them too."""
    for _ in range(max(10, n // 10)):  # warm up
        call()
    samples = []
    if cpu:
        cpu.start()
    for _ in range(n):
        start = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - start) / 1000.0)
    result = {"p50_us": percentile(samples, 0.5),
              "p99_us": percentile(samples, 0.99)}
    if cpu:
        result["cpu_us_per_call"] = cpu.per_call_us(n)
    return result


WORKLOADS = ["rpc_sync builtin", "rpc_sync python", "rpc_sync object",
             "rpc_async + wait",
             "remote + to_here", "dist autograd step", "rpc_async builtin",
             "echo 64 MiB"]


def run_socket(rank, n):
    """The floor: n round trips of 16 bytes over one TCP connection."""
    port = int(os.environ["MASTER_PORT"])
    if rank == 1:
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(1)
            conn, _ = listener.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while True:
                    data = conn.recv(16, socket.MSG_WAITALL)
                    if len(data) < 16:
                        return
                    conn.sendall(data)
    for _ in range(100):
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = b"x" * 16

        def round_trip():
            conn.sendall(message)
            conn.recv(16, socket.MSG_WAITALL)

        print("JSON " + json.dumps({"tcp ping-pong": timed(n, round_trip)}),
              flush=True)


def run(impl, rank, n, backend, transports, workloads, busy_poll_us=0,
        idle_s=5.0, spare_core_poll_us=-1):
    global rpc
    if impl == "socket":
        run_socket(rank, n)
        return
    import torch
    if impl == "tether":
        import tether.autograd as dist_autograd
        import tether.rpc as rpc
        kwargs = {"backend": backend}
        if transports or busy_poll_us or spare_core_poll_us >= 0:
            polling = ({"spare_core_poll": spare_core_poll_us / 1e6}
                       if spare_core_poll_us >= 0 else {})
            kwargs["rpc_backend_options"] = rpc.RpcBackendOptions(
                backend_settings=(
                    {"tensorpipe.transports": transports} if transports
                    else {}),
                busy_poll=busy_poll_us / 1e6, **polling)
    else:
        import torch.distributed.autograd as dist_autograd
        import torch.distributed.rpc as rpc
        kwargs = {}
    rpc.init_rpc("w%d" % rank, rank=rank, world_size=2, **kwargs)
    if rank == 0:
        t = torch.ones(2)
        result = {}
        cpu = CpuUse(rpc, "w1")

        def measured(n, call):
            return timed(n, call, cpu)

        if "rpc_sync builtin" in workloads:
            result["rpc_sync builtin"] = measured(
                n, lambda: rpc.rpc_sync("w1", torch.add, args=(t, 1)))
        if "rpc_sync python" in workloads:
            result["rpc_sync python"] = measured(
                n, lambda: rpc.rpc_sync("w1", py_add, args=(t, 1)))
        if "rpc_sync object" in workloads:
            import numpy
            obs = Observation(numpy.arange(4, dtype=numpy.float32), 7,
                              torch.ones(2))
            result["rpc_sync object"] = measured(
                n, lambda: rpc.rpc_sync("w1", echo, args=(obs,)))
        if "rpc_async + wait" in workloads:
            result["rpc_async + wait"] = measured(
                n, lambda: rpc.rpc_async("w1", torch.add, args=(t, 1)).wait())
        if "remote + to_here" in workloads:
            result["remote + to_here"] = measured(
                n // 3, lambda: rpc.remote("w1", torch.add,
                                           args=(t, 1)).to_here())
        if "dist autograd step" in workloads:
            linear = rpc.remote("w1", make_linear)
            x = torch.randn(64, 256, requires_grad=True)
            result["dist autograd step"] = measured(
                n // 3, lambda: autograd_step(dist_autograd, linear, x))
            del linear
        if "rpc_async builtin" in workloads:
            calls = 10 * n
            pending = collections.deque()
            cpu.start()
            start = time.perf_counter()
            for _ in range(calls):
                pending.append(rpc.rpc_async("w1", torch.add, args=(t, 1)))
                if len(pending) >= 64:
                    pending.popleft().wait()
            while pending:
                pending.popleft().wait()
            result["rpc_async builtin"] = {
                "calls_per_s": calls / (time.perf_counter() - start),
                "cpu_us_per_call": cpu.per_call_us(calls)}
        if "echo 64 MiB" in workloads:
            big = torch.ones(64 << 20, dtype=torch.uint8)
            echoed = measured(max(10, n // 150),
                              lambda: rpc.rpc_sync("w1", echo, args=(big,)))
            echoed["GBps"] = 2 * big.numel() / echoed["p50_us"] / 1e3
            result["echo 64 MiB"] = echoed
        # No calls for a while, after them: each process's share of a core.
        result["idle"] = dict(zip(("caller_percent", "callee_percent"),
                                  cpu.idle_percent(idle_s)), seconds=idle_s)
        print("JSON " + json.dumps(result), flush=True)
    rpc.shutdown()


def measure(impl, n, backend, transports, workloads, busy_poll_us=0,
            idle_s=5.0, spare_core_poll_us=-1):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--impl", impl,
         "--rank", str(rank), "--n", str(n), "--backend", backend,
         "--transports", transports, "--workloads", ",".join(workloads),
         "--busy_poll_us", str(busy_poll_us), "--idle_s", str(idle_s),
         "--spare_core_poll_us", str(spare_core_poll_us)],
        env=env, stdout=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            sys.exit("%s rank failed (%d):\n%s" % (impl, p.returncode, out))
    line = [l for l in outs[0].splitlines() if l.startswith("JSON ")][0]
    return json.loads(line[5:])


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def row(name, tether, peer):
    def both(key):
        return (median([r[name][key] for r in tether]),
                median([r[name][key] for r in peer]))
    ca, cb = both("cpu_us_per_call")
    cpu = "| %.1f | %.1f | %.2fx |" % (ca, cb, cb / ca)
    if name == "echo 64 MiB":
        a, b = both("GBps")
        return "| %s, GB/s | %.2f | %.2f | %.2fx %s" % (name, a, b, a / b, cpu)
    if name == "rpc_async builtin":
        a, b = both("calls_per_s")
        return ("| %s, 64 in flight, calls/s | %.0f | %.0f | %.2fx %s"
                % (name, a, b, a / b, cpu))
    a, b = both("p50_us")
    a99, b99 = both("p99_us")
    return ("| %s p50 (p99), us | %.1f (%.1f) | %.1f (%.1f) | %.2fx %s"
            % (name, a, a99, b, b99, b / a, cpu))


def idle_row(tether, peer):
    def one(side):
        return tuple(median([r["idle"][key] for r in side])
                     for key in ("caller_percent", "callee_percent"))
    return ("Idle CPU over %s s after the calls, %% of a core, caller and "
            "callee: tether %.2f and %.2f, peer %.2f and %.2f."
            % ((tether[0]["idle"]["seconds"],) + one(tether) + one(peer)))


def speedup(name, tether, peer):
    """How many times better tether is at a workload (medians of rounds)."""
    key = {"echo 64 MiB": "GBps", "rpc_async builtin": "calls_per_s"}.get(
        name, "p50_us")
    a = median([r[name][key] for r in tether])
    b = median([r[name][key] for r in peer])
    return a / b if key != "p50_us" else b / a


def plot(path, tether, peer, workloads):
    """Three panels: tether's speed over the peer's per workload, CPU per
    call (both processes) and idle CPU per process, medians of the rounds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 1.8 + 0.4 * len(workloads)),
                             dpi=80)
    ys = range(len(workloads))
    axes[0].barh(ys, [speedup(w, tether, peer) for w in workloads])
    axes[0].axvline(1, color="black", linewidth=0.8)
    axes[0].set_xlabel("tether's speed / the peer's (x)")
    axes[0].set_yticks(list(ys))
    axes[0].set_yticklabels(workloads, fontsize=8)
    for i, (side, rounds) in enumerate((("tether", tether), ("peer", peer))):
        axes[1].barh([y + 0.4 * i for y in ys],
                     [median([r[w]["cpu_us_per_call"] for r in rounds])
                      for w in workloads], height=0.4, label=side)
    axes[1].set_xlabel("CPU per call, both processes (us)")
    axes[1].set_yticks([y + 0.2 for y in ys])
    axes[1].set_yticklabels(workloads, fontsize=8)
    axes[1].legend(fontsize=8)
    roles = ("caller_percent", "callee_percent")
    for i, (side, rounds) in enumerate((("tether", tether), ("peer", peer))):
        axes[2].bar([j + 0.4 * i for j in range(2)],
                    [median([r["idle"][k] for r in rounds]) for k in roles],
                    width=0.4, label=side)
    axes[2].set_yscale("log")
    axes[2].set_xticks([0.2, 1.2])
    axes[2].set_xticklabels(["caller", "callee"])
    axes[2].set_ylabel("idle CPU (% of a core, log)")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].invert_yaxis()
    axes[1].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backend", default="tensorpipe")
    parser.add_argument("--transports", default="")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workloads", default="")
    parser.add_argument("--impl")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--n", type=int)
    parser.add_argument("--busy_poll_us", type=int, default=0)
    parser.add_argument("--spare_core_poll_us", type=int, default=-1,
                        help="tether's RpcBackendOptions(spare_core_poll=...)"
                        " in us (default: the library's)")
    parser.add_argument("--idle_s", type=float, default=None)
    parser.add_argument("--out", default="",
                        help="also write every round's numbers to this JSON "
                        "file")
    parser.add_argument("--plot", default="",
                        help="also draw speed, CPU per call and idle CPU, "
                        "tether beside the peer, into this PNG file")
    args = parser.parse_args()
    if args.idle_s is None:
        args.idle_s = 2.0 if args.quick else 5.0
    words = [w for w in args.workloads.split(",") if w]
    workloads = [w for w in WORKLOADS
                 if not words or any(word in w for word in words)]
    if not workloads:
        sys.exit("py_bench: no workload matches --workloads %s; they are: %s"
                 % (args.workloads, ", ".join(WORKLOADS)))
    if args.impl:
        run(args.impl, args.rank, args.n, args.backend, args.transports,
            workloads, args.busy_poll_us, args.idle_s,
            args.spare_core_poll_us)
        return
    n = 300 if args.quick else 3000
    floor = "rpc_sync builtin" in workloads
    tether, peer, sockets = [], [], []
    for r in range(args.rounds):
        tether.append(measure("tether", n, args.backend, args.transports,
                              workloads, args.busy_poll_us, args.idle_s,
                              args.spare_core_poll_us))
        peer.append(measure("peer", n, args.backend, "", workloads,
                            idle_s=args.idle_s))
        if floor:
            sockets.append(measure("socket", n, args.backend, "", []))
        if args.rounds > 1:
            print("round %d: %s" % (r + 1, json.dumps(
                {"tether": tether[-1], "peer": peer[-1],
                 "socket": sockets[-1] if floor else None})), flush=True)
    huge = os.environ.get("THP_MEM_ALLOC_ENABLE", "0") not in ("", "0")
    print("| workload | tether (%s%s%s%s) | peer (tensorpipe) | better by "
          "| CPU per call, us: tether | peer | tether's less by |"
          % (args.backend, " " + args.transports if args.transports else "",
             ", busy poll %d us" % args.busy_poll_us
             if args.busy_poll_us else "",
             ", huge pages" if huge else ""))
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in workloads:
        print(row(name, tether, peer))
    print("\n" + idle_row(tether, peer))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["tools/py_bench.py"] + sys.argv[1:]),
                       "load_average": os.getloadavg(),
                       "tether": tether, "peer": peer, "socket": sockets},
                      f, indent=1)
    if args.plot:
        plot(args.plot, tether, peer, workloads)
        print("wrote %s" % args.plot)
    if floor:
        ping = median([r["tcp ping-pong"]["p50_us"] for r in sockets])
        ping99 = median([r["tcp ping-pong"]["p99_us"] for r in sockets])
        fifth = median([r["rpc_sync builtin"]["p50_us"] for r in peer]) / 5
        print("\nFloor: a Python TCP ping-pong of 16 bytes between the same "
              "two processes (no RPC; each side asleep in recv): p50 %.1f "
              "us (p99 %.1f). 1/5 of the peer's rpc_sync builtin p50: %.1f "
              "us." % (ping, ping99, fifth))


if __name__ == "__main__":
    main()
