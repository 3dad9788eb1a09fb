#!/usr/bin/python3
"""peer_bench: tether's benchmark workloads on torch.distributed.rpc.

The peer's column of `tools/bench`: the same workloads as
tools/bench_worker.cc, with the same JSON keys, on PyTorch's own RPC
(Debian's python3-torch, TensorPipe backend) between two local processes.

    /usr/bin/python3 tools/peer_bench.py [--quick] [--transports uv]
        [--channels basic] [--max_bytes N]

The parent (which does not load torch: it is slow to import) starts two
children (rank 0 and rank 1) of this same script; rank 0 times every call
and prints one line `JSON {...}`, which the parent passes on. With
--launched there is no parent: a launcher started this process as one of
the two (as tools/bench --hosts does, one per simulated host), and RANK,
MASTER_ADDR and MASTER_PORT say which and where rank 0 is. Without
torch.distributed.rpc (or TensorPipe) the children exit with status 3 and
the parent prints `JSON {"status": "n/a: ..."}` and exits 0, so the bench
CLI shows the peer as not available instead of failing.

Workloads (rank 0 -> rank 1), as tools/bench_worker.cc runs them:
  builtin_rpc_sync_p50_us / _p99_us  rpc_sync(torch.add, (2-float tensor, 1.0))
  builtin_rpc_async_calls_per_s      the same call, 64 in flight
  builtin_rpc_sync_cpu_us_per_call,  CPU time (user + system, every thread
  builtin_rpc_async_cpu_us_per_call  of both processes) over the measured
                                     calls, per call
  idle_cpu_percent_caller, _callee   each process's CPU over --idle_ms with
                                     no calls, after the small calls, in %
                                     of a core
  remote_to_here_p50_us              rpc.remote(...).to_here() of that call
  echo_1MB_GBps, echo_64MB_GBps      a uint8 tensor through a TorchScript
                                     identity, bytes counted both ways
  dist_autograd_step_p50_us          in a context: a remote nn.Linear(256,
                                     256) forward through an RRef proxy on a
                                     64x256 input requiring grad, backward,
                                     get_gradients (local_autograd_step_p50_us:
                                     the same compute in rank 0, no RPC)
  sweep                              echo p50/p99 and GB/s per payload size
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

from benchlib.python_rpc import (  # beside this script
    CpuUse, autograd_step, free_port, percentile)

# Only the children (--rank) load torch; see load_torch().
torch = dist_autograd = rpc = None
NOT_AVAILABLE = 3  # a child's exit status: no usable torch.distributed.rpc

# Iteration counts: (full, quick). Same presets as tools/bench_worker.cc.
PRESETS = {
    "sync_calls": (3000, 3000),  # as many: see tools/bench_worker.cc
    "async_calls": (20000, 2000),
    "remote_calls": (1000, 200),
    "autograd_steps": (300, 30),
    # Sweep: iterations per size = clamp(sweep_bytes / size, min, max).
    "sweep_bytes": (1 << 30, 64 << 20),
    "sweep_min_iters": (10, 3),
    "sweep_max_iters": (1000, 100),
    "idle_ms": (5000, 2000),
}
ASYNC_WINDOW = 64
# 8 B, then powers of 4 from 64 B to 64 MiB (1 MiB and 64 MiB included).
SIZES = [8] + [4 ** k for k in range(3, 14)]


def load_torch():
    """Imports torch for a child; None, or why the peer cannot run."""
    global torch, dist_autograd, rpc, identity
    try:
        import torch
        import torch.distributed.autograd as dist_autograd
        import torch.distributed.rpc as rpc
    except ImportError as error:  # the peer is optional: report, not fail
        return ("torch is not importable by %s (%s); scripts/bench_setup.sh "
                "installs python3-torch" % (sys.executable, error))
    if not rpc.is_available() or not hasattr(rpc,
                                             "TensorPipeRpcBackendOptions"):
        return "this torch has no torch.distributed.rpc with TensorPipe"

    # Defined on both ranks: the peer calls it by its TorchScript name.
    @torch.jit.script
    def identity(x: torch.Tensor) -> torch.Tensor:
        return x
    return None


def timed(fn, iterations, warmup):
    """Per-call samples in microseconds, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return samples


def timed_alternating(fn_a, fn_b, iterations, warmup):
    """Per-call samples of fn_a and fn_b, run alternately."""
    samples_a, samples_b = [], []
    for i in range(warmup + iterations):
        start = time.perf_counter()
        fn_a()
        middle = time.perf_counter()
        fn_b()
        end = time.perf_counter()
        if i >= warmup:
            samples_a.append((middle - start) * 1e6)
            samples_b.append((end - middle) * 1e6)
    return sorted(samples_a), sorted(samples_b)


def run_rank0(args):
    x = torch.ones(2)
    out = {}
    cpu = CpuUse(rpc, "w1")
    warmup = max(100, args.sync_calls // 10)
    timed(lambda: rpc.rpc_sync("w1", torch.add, args=(x, 1.0)), 0, warmup)
    cpu.start()
    sync = timed(lambda: rpc.rpc_sync("w1", torch.add, args=(x, 1.0)),
                 args.sync_calls, 0)
    out["builtin_rpc_sync_cpu_us_per_call"] = cpu.per_call_us(args.sync_calls)
    out["builtin_rpc_sync_p50_us"] = percentile(sync, 0.5)
    out["builtin_rpc_sync_p99_us"] = percentile(sync, 0.99)

    def async_run(calls):
        window = collections.deque()
        for _ in range(calls):
            if len(window) == ASYNC_WINDOW:
                window.popleft().wait()
            window.append(rpc.rpc_async("w1", torch.add, args=(x, 1.0)))
        while window:
            window.popleft().wait()
    async_run(max(ASYNC_WINDOW * 4, args.async_calls // 10))
    cpu.start()
    start = time.perf_counter()
    async_run(args.async_calls)
    out["builtin_rpc_async_calls_per_s"] = (
        args.async_calls / (time.perf_counter() - start))
    out["builtin_rpc_async_cpu_us_per_call"] = cpu.per_call_us(
        args.async_calls)

    # Idle: no calls for a while; each process's share of a core.
    (out["idle_cpu_percent_caller"],
     out["idle_cpu_percent_callee"]) = cpu.idle_percent(args.idle_ms / 1e3)

    remote = timed(
        lambda: rpc.remote("w1", torch.add, args=(x, 1.0)).to_here(),
        args.remote_calls, max(20, args.remote_calls // 10))
    out["remote_to_here_p50_us"] = percentile(remote, 0.5)

    torch.manual_seed(1)
    linear = rpc.remote("w1", torch.nn.Linear, args=(256, 256))
    inputs = torch.randn(64, 256, requires_grad=True)

    # Alternating with the same Linear's compute here (the step's floor).
    local = torch.nn.Linear(256, 256)
    local_inputs = torch.randn(64, 256, requires_grad=True)
    steps, floor = timed_alternating(
        lambda: autograd_step(dist_autograd, linear, inputs),
        lambda: local(local_inputs).sum().backward(),
        args.autograd_steps, max(5, args.autograd_steps // 10))
    out["dist_autograd_step_p50_us"] = percentile(steps, 0.5)
    out["local_autograd_step_p50_us"] = percentile(floor, 0.5)

    sweep = []
    for size in [s for s in SIZES if s <= args.max_bytes]:
        payload = torch.ones(size, dtype=torch.uint8)
        iterations = min(args.sweep_max_iters,
                         max(args.sweep_min_iters, args.sweep_bytes // size))
        samples = timed(lambda: rpc.rpc_sync("w1", identity, args=(payload,)),
                        iterations, max(1, iterations // 10))
        p50 = percentile(samples, 0.5)
        sweep.append({"bytes": size, "iterations": iterations,
                      "p50_us": p50, "p99_us": percentile(samples, 0.99),
                      "GBps": 2 * size / (p50 * 1e3)})
    out["sweep"] = sweep
    by_size = {row["bytes"]: row["GBps"] for row in sweep}
    out["echo_1MB_GBps"] = by_size.get(1 << 20)
    out["echo_64MB_GBps"] = by_size.get(64 << 20)
    return out


def child(args):
    why = load_torch()
    if why is not None:
        print(why, file=sys.stderr, flush=True)
        sys.exit(NOT_AVAILABLE)
    options = rpc.TensorPipeRpcBackendOptions(
        init_method="tcp://%s:%d" % (args.master_addr, args.port),
        rpc_timeout=300)
    if args.transports:
        options._transports = args.transports.split(",")
    if args.channels:
        options._channels = args.channels.split(",")
    rpc.init_rpc("w%d" % args.rank, rank=args.rank, world_size=2,
                 rpc_backend_options=options)
    result = run_rank0(args) if args.rank == 0 else None
    rpc.shutdown()
    if result is not None:
        result["status"] = "ok"
        result["torch"] = torch.__version__
        print("JSON " + json.dumps(result), flush=True)


def unavailable(why):
    print("JSON " + json.dumps({"status": "n/a: " + why}), flush=True)
    return 0


def parent(args, argv):
    port = free_port()
    children = [
        subprocess.Popen([sys.executable, os.path.abspath(__file__),
                          "--rank", str(rank), "--port", str(port)] + argv,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for rank in (0, 1)]
    try:
        outputs = [c.communicate(timeout=args.timeout) for c in children]
    except subprocess.TimeoutExpired:
        for c in children:
            c.kill()
        return unavailable("timed out after %d s" % args.timeout)
    failed = [(rank, c.returncode, outputs[rank][1])
              for rank, c in enumerate(children) if c.returncode != 0]
    if failed:
        rank, code, err = failed[0]
        tail = " | ".join(err.strip().splitlines()[-3:])
        if code == NOT_AVAILABLE:
            return unavailable(tail)
        return unavailable("rank %d exited %d: %s" % (rank, code, tail))
    sys.stdout.write(outputs[0][0])
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer iterations (the CLI's quick mode)")
    parser.add_argument("--max_bytes", type=int, default=SIZES[-1],
                        help="largest sweep size")
    parser.add_argument("--transports", default="",
                        help="TensorPipe transports, e.g. uv (default: all)")
    parser.add_argument("--channels", default="",
                        help="TensorPipe channels, e.g. basic (default: all)")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--launched", action="store_true",
                        help="one of the two, started by a launcher: RANK, "
                        "MASTER_ADDR and MASTER_PORT from the environment")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master_addr", default="127.0.0.1",
                        help=argparse.SUPPRESS)
    for name in PRESETS:
        parser.add_argument("--" + name, type=int, default=None)
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    for name, (full, quick) in PRESETS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.launched:
        try:
            args.rank = int(os.environ["RANK"])
            args.port = int(os.environ["MASTER_PORT"])
            args.master_addr = os.environ["MASTER_ADDR"]
        except (KeyError, ValueError) as error:
            parser.error("--launched needs RANK, MASTER_ADDR and MASTER_PORT "
                         "set by a launcher (%r)" % error)
    if args.rank is not None:
        child(args)
        return 0
    return parent(args, argv)


if __name__ == "__main__":
    sys.exit(main())
