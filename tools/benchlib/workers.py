"""Each backend variant's workloads in a fresh pair of bench_worker
processes (VARIANTS); a backend this build does not register is "n/a"."""
import time

from .hosts import placed_env
from .processes import (common_args, parse_json_line, run, run_two_process,
                        short)
from .variants import VARIANTS

# --smoke (tests only): a handful of calls per workload; numbers meaningless.
SMOKE_COUNTS = ["--sync_calls=20", "--async_calls=256", "--remote_calls=10",
                "--autograd_steps=3", "--sweep_bytes=1", "--sweep_min_iters=2",
                "--sweep_max_iters=2", "--stream_bytes=1048576",
                "--memcpy_iters=2", "--idle_ms=200"]


def worker_args(args):
    return common_args(args) + (SMOKE_COUNTS if args.smoke else [])


def registered_backends(args):
    """{name: "ok" or why not viable} of bench_worker's registry, or None."""
    code, out, _ = run([args.worker, "--list"], 60)
    listed = parse_json_line(out) if code == 0 else None
    return listed.get("backends") if listed else None


def run_variants(args, log):
    results = {}
    registered = registered_backends(args)
    for label, backend, settings, env in VARIANTS:
        if args.only and label not in args.only:
            continue
        if registered is not None and backend not in registered:
            # Saves starting two processes to learn the same.
            results[label] = {"status": "n/a: backend \"%s\" is not "
                              "registered in this build" % backend}
            log("%-24s %s" % (label, short(results[label]["status"])))
            continue
        argv = [args.worker, "--backend=" + backend, "--label=" + label]
        argv += ["--setting=%s=%s" % kv for kv in sorted(settings.items())]
        start = time.time()
        if args.hosts:
            env = placed_env(env)
        results[label] = run_two_process(args, argv + worker_args(args),
                                         args.timeout, env)
        log("%-24s %-10s %5.1f s" % (label, short(results[label]["status"]),
                                     time.time() - start))
    return results
