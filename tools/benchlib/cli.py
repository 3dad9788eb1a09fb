"""bench: tether's benchmarks across backends, raw baselines and the peer.

One command that runs the same workloads between two local
processes on every viable backend variant, the raw baselines and PyTorch's
torch.distributed.rpc (the peer), then prints the tables, writes JSON and
draws PNG plots:

    bazel run -c opt //tools:bench -- [--quick] [--out DIR]

or, with the binaries built (this script builds nothing):

    bazel build -c opt //tools:bench_worker //tools:tether_run
    tools/bench.py [--quick] [--out DIR]

Variants (VARIANTS in tools/benchlib/variants.py): tensorpipe uv, shm,
tcp (tether's guarded transport), negotiated (the default: tcp +
cma_write), tcp and negotiated with RpcOptions::busy_poll at 100 us, and
uv,shm (TensorPipe's own transports, which a stranger's bytes can crash;
for comparison); grpc, and grpc with busy_poll; libfabric with provider
tcp;ofi_rxm (also with busy_poll) and shm. A backend that this build does not register, or that is not viable
here, is shown as "n/a" with the reason (bench_worker decides, from the
same registry users get from register_builtin_backends), so new backends
appear once registered.

Raw baselines: bench_worker --raw (TCP ping-pong and stream between two
processes, memcpy, and TensorPipe's pipe alone: the tensorpipe backend's
floor for a small call), plus the tools in EXTERNAL_BASELINES
(baselines.py) when their binaries are built (bare gRPC:
//tools:grpc_pingpong, a data dependency of //tools:bench; raw libfabric:
//tools:fabric_pingpong), otherwise "n/a".
Each variant is compared with its own limit (BASELINE_OF). An external
tool runs under tether_run --nproc 2 and prints, from rank 0, one line
`JSON {"p50_us": <smallest round trip>, "sweep": [{"bytes": B, "p50_us": T,
"GBps": G}, ...]}` (parse_json_line).

Peer: tools/peer_bench.py under Debian's /usr/bin/python3 (python3-torch,
installed by scripts/bench_setup.sh): its default TensorPipe (shm + cma
here, like tether's negotiated variant) and, except in quick mode, uv only
(like tether's uv).

Output: the tables on stdout (Markdown) and in DIR/table.md, every number in
DIR/results.json, DIR/latency_vs_size.png, DIR/bandwidth_vs_size.png and
DIR/cpu.png. Beside the latencies, every variant and peer reports CPU
(user + system of every thread of both processes, CLOCK_PROCESS_CPUTIME_ID /
time.process_time(), read in each process by a call) per rpc_sync and per
rpc_async call over the measured calls, and each process's idle CPU over 5 s
(2 s quick) with no calls, after the small calls.

Across hosts (tools/benchlib/hosts.py): with --hosts each run's two
processes are on two simulated hosts (testing/hosts/on_hosts.sh: network
namespaces on a bridge, each host with its own pid, mount and uts
namespaces; needs root), rank 0 on host 0 and rank 1 on host 1 with
MASTER_ADDR host 0's address, so the network path is timed, not loopback,
shm or cma. The peer runs there too (peer_bench.py --launched; its
TensorPipe can only negotiate uv + basic between the hosts). Raw TCP and
TensorPipe's pipe alone run between the hosts too; the external baselines
listen on 127.0.0.1 and are n/a. Where namespaces cannot be made
the bench says why and exits 2 (it never falls back to loopback):

    tools/bench.py --hosts --quick --only "tensorpipe negotiated"

Scale (tools/benchlib/scale.py): with --scale 2,4,8,16,32,64 it
runs instead N scale_worker processes per world size and backend variant
(--backends: labels or backend names; by default tensorpipe negotiated,
grpc, libfabric tcp;ofi_rxm and shm) and a bare process start, and writes
them under "scale" in DIR/results.json (the other results there are kept),
the scale tables in DIR/table.md and DIR/scale.png:

    bazel build -c opt //tools:scale_worker //tools:tether_run
    tools/bench.py --scale 2,4,8,16,32,64 --out docs/bench

Every path the results name is relative to the repository.
"""
import argparse
import datetime
import json
import os
import platform
import sys
import time

from . import scale as scale_workload
from .baselines import run_baselines
from .hosts import check_hosts, launcher
from .peers import run_peers
from .plots import plot, plot_anywhere
from .processes import find_binary, search_dirs, workspace_dir
from .results import limit_rows, merge_runs, peer_rows
from .tables import report, scale_report
from .variants import VARIANTS
from .workers import run_variants


def write_results(args, results, out_dir, log):
    """DIR/results.json, DIR/table.md and, unless --no_plots, the plots."""
    results_path = os.path.join(out_dir, "results.json")
    with open(results_path, "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(report(results))
    log("wrote %s and table.md" % results_path)
    if not args.no_plots:
        plot_anywhere(args, results_path, out_dir, log)


def find_tools(args, worker, log):
    """The path of tools/`worker`, with args.tether_run set; None, saying
    how to build them, if either is missing."""
    path = find_binary(args, "tools/" + worker)
    args.tether_run = find_binary(args, "tools/tether_run")
    if path is None or args.tether_run is None:
        log("bench: %s or tether_run not found in %s; build them first: "
            "bazel build -c opt //tools:%s //tools:tether_run"
            % (worker, ", ".join(search_dirs(args)), worker))
        return None
    return path


def recorded_command(argv):
    """This run's command line, any path under the workspace relative to it."""
    return " ".join(["tools/bench"] + [relative_to_workspace(a) for a in argv])


def main_scale(args, out_dir, log):
    """--scale: the scale workload alone, merged into DIR/results.json."""
    args.scale_worker = find_tools(args, "scale_worker", log)
    if args.scale_worker is None:
        return 2
    try:
        scale_workload.pick_variants(VARIANTS, args.backends)
    except ValueError as e:
        log("bench: %s" % e)
        return 2
    started = time.time()
    load = os.getloadavg()[0]
    scale = scale_workload.run_scale(args, VARIANTS, log)
    scale.update({
        "command": recorded_command(sys.argv[1:]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "loadavg_at_start": load, "loadavg_at_end": os.getloadavg()[0],
        "seconds": time.time() - started})
    results_path = os.path.join(out_dir, "results.json")
    results = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = json.load(f)
    results["scale"] = scale_workload.merge_scale(results.get("scale"), scale)
    print(scale_report(results["scale"]))
    write_results(args, results, out_dir, log)
    return 0


def relative_to_workspace(arg, root=None):
    """`arg` with an absolute path made relative to the workspace; one
    outside it keeps only its last component (".../NAME"): the results name
    no folder of the machine they ran on."""
    root = root or workspace_dir()
    name, eq, value = arg.partition("=")
    path = value if eq else arg
    if not os.path.isabs(path):
        return arg
    path = os.path.abspath(path)
    if os.path.commonpath([root, path]) == root:
        path = os.path.relpath(path, root)
    else:
        path = ".../" + os.path.basename(path)
    return name + "=" + path if eq else path


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--quick", action="store_true",
                        help="fewer iterations (under 2 minutes)")
    parser.add_argument("--out", default=None,
                        help="output folder (default: ./bench_results)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run everything N times, report medians")
    parser.add_argument("--only", action="append",
                        help="run only this variant (repeatable)")
    parser.add_argument("--max_bytes", type=int, default=0,
                        help="largest payload of the sweep (default 64 MiB)")
    parser.add_argument("--timeout", type=int, default=0,
                        help="seconds per run (default 120 quick, 1800 full)")
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="interpreter with torch for the peer and plots")
    parser.add_argument("--no_peer", action="store_true")
    parser.add_argument("--bin_dir", default=None,
                        help="where bench_worker and tether_run are")
    parser.add_argument("--smoke", action="store_true",
                        help="tests: a handful of calls (numbers meaningless)")
    parser.add_argument("--no_plots", action="store_true")
    parser.add_argument("--plot_only", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--hosts", action="store_true",
                        help="each run's two processes on two simulated "
                        "hosts (network namespaces; needs root): the network "
                        "path, not loopback, shm or cma")
    parser.add_argument("--scale", default=None,
                        type=scale_workload.parse_sizes,
                        help="world sizes for the scale workload, e.g. "
                        "2,4,8,16,32,64 (runs only that)")
    parser.add_argument("--backends", default=None,
                        type=lambda text: [w for w in text.split(",") if w],
                        help="--scale: variant labels or backend names")
    parser.add_argument("--scale_timeout", type=int, default=900,
                        help="--scale: seconds per world")
    parser.add_argument("--scale_logs", default=None,
                        help="--scale: a folder for every world's output")
    args = parser.parse_args()
    if args.hosts and (args.scale or args.plot_only):
        parser.error("--hosts runs the two-process workloads, not --scale "
                     "or --plot_only")
    cwd = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
    out_dir = os.path.join(cwd, args.out or "bench_results")
    os.makedirs(out_dir, exist_ok=True)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.plot_only:
        with open(args.plot_only) as f:
            for path in plot(json.load(f), out_dir):
                print("wrote " + path)
        return 0
    if args.scale:
        return main_scale(args, out_dir, log)
    if not args.timeout:
        args.timeout = 120 if args.quick else 1800
    args.worker = find_tools(args, "bench_worker", log)
    if args.worker is None:
        return 2
    args.launcher = lambda timeout: [args.tether_run, "--nproc", "2", "--"]
    if args.hosts:
        script = check_hosts(log)
        if script is None:
            return 2
        args.launcher = lambda timeout: launcher(script, timeout)

    started = time.time()
    results = {
        # Paths of this machine stay out of the record: an absolute path
        # under the workspace is written relative to it.
        "command": recorded_command(sys.argv[1:]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "kernel": platform.release(),
                 # Other work on the machine moves every number.
                 "loadavg_at_start": os.getloadavg()[0]},
        "quick": args.quick,
        # Where the two processes ran: one machine, or two simulated hosts.
        "placement": "two simulated hosts" if args.hosts else "one host",
    }
    runs = []
    for repeat in range(args.repeat):
        if args.repeat > 1:
            log("round %d of %d" % (repeat + 1, args.repeat))
        runs.append({"variants": run_variants(args, log),
                     "baselines": run_baselines(args, log),
                     "peers": run_peers(args, log)})
    for group in ("variants", "baselines", "peers"):
        results[group] = {label: merge_runs([run[group][label] for run in runs])
                          for label in runs[0][group]}
    results["repeat"] = args.repeat
    if args.repeat > 1:
        results["runs"] = runs
    results["limits"] = limit_rows(results)
    results["peer_targets"] = peer_rows(results)
    results["seconds"] = time.time() - started
    results["host"]["loadavg_at_end"] = os.getloadavg()[0]

    print(report(results))
    write_results(args, results, out_dir, log)
    log("bench: %.0f s in all" % (time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
