#!/usr/bin/env python3
"""bench: tether's benchmarks across backends, raw baselines and the peer.

One command that runs the same workloads between two local
processes on every viable backend variant, the raw baselines and PyTorch's
torch.distributed.rpc (the peer), then prints the tables, writes JSON and
draws PNG plots:

    bazel run -c opt //tools:bench -- [--quick] [--out DIR]

or, with the binaries built (this script builds nothing):

    bazel build -c opt //tools:bench_worker //tools:tether_run
    tools/bench.py [--quick] [--out DIR]

Variants (VARIANTS below): tensorpipe uv, shm, tcp (tether's guarded
transport), negotiated (the default: tcp + cma_write), tcp and negotiated with
RpcOptions::busy_poll at 100 us, and uv,shm (TensorPipe's own transports,
which a stranger's bytes can crash; for comparison); grpc, and grpc with
busy_poll; libfabric with provider tcp;ofi_rxm (also with busy_poll) and
shm. A backend that this build does not register, or that is not viable
here, is shown as "n/a" with the reason (bench_worker decides, from the
same registry users get from register_builtin_backends), so new backends
appear once registered.

Raw baselines: bench_worker --raw (TCP ping-pong and stream between two
processes, memcpy, and TensorPipe's pipe alone: the tensorpipe backend's
floor for a small call), plus the tools in EXTERNAL_BASELINES when their binaries
are built (bare gRPC: //tools:grpc_pingpong, a data dependency of
//tools:bench; raw libfabric: //tools:fabric_pingpong), otherwise "n/a".
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

Scale (tools/bench_scale.py): with --scale 2,4,8,16,32,64 it
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
import re
import shutil
import signal
import subprocess
import sys
import time

try:
    from tools import bench_scale  # under Bazel: the runfiles root
except ImportError:
    import bench_scale  # tools/bench.py run as a script

# The bench's workload keys, in table order: (key, label, unit, better).
WORKLOADS = [
    ("builtin_rpc_sync_p50_us", "rpc_sync p50", "us", "lower"),
    ("builtin_rpc_sync_p99_us", "rpc_sync p99", "us", "lower"),
    ("builtin_rpc_async_calls_per_s", "rpc_async, 64 in flight", "calls/s",
     "higher"),
    ("remote_to_here_p50_us", "remote + to_here p50", "us", "lower"),
    ("echo_1MB_GBps", "echo 1 MiB", "GB/s", "higher"),
    ("echo_64MB_GBps", "echo 64 MiB", "GB/s", "higher"),
    ("dist_autograd_step_p50_us", "dist autograd step p50", "us", "lower"),
    # CPU, user + system of every thread of both processes, per measured
    # call; and each process's share of a core with no calls, after them.
    ("builtin_rpc_sync_cpu_us_per_call", "rpc_sync CPU per call", "us",
     "lower"),
    ("builtin_rpc_async_cpu_us_per_call", "rpc_async CPU per call", "us",
     "lower"),
    ("idle_cpu_percent_caller", "idle CPU, caller", "% of a core", "lower"),
    ("idle_cpu_percent_callee", "idle CPU, callee", "% of a core", "lower"),
]
CPU_KEYS = [k for k, *_ in WORKLOADS if "cpu" in k]

# (label, backend, settings, extra environment).
VARIANTS = [
    ("tensorpipe uv", "tensorpipe",
     {"tensorpipe.transports": "uv", "tensorpipe.channels": "basic"}, {}),
    ("tensorpipe shm", "tensorpipe",
     {"tensorpipe.transports": "shm", "tensorpipe.channels": "basic"}, {}),
    ("tensorpipe tcp", "tensorpipe",
     {"tensorpipe.transports": "tcp", "tensorpipe.channels": "basic"}, {}),
    ("tensorpipe negotiated", "tensorpipe", {}, {}),
    # RpcOptions::busy_poll (bench_worker takes it as a setting): waiting
    # threads poll for 100 us before they sleep.
    ("tensorpipe tcp, busy poll", "tensorpipe",
     {"tensorpipe.transports": "tcp", "tensorpipe.channels": "basic",
      "busy_poll_us": "100"}, {}),
    ("tensorpipe negotiated, busy poll", "tensorpipe",
     {"busy_poll_us": "100"}, {}),
    # Tensors of 2 MiB and more on transparent huge pages, as PyTorch 2.1
    # and later do when asked (core/huge_pages.h): fewer pages for every
    # copy of them (the cma_write channel pins the receiver's, on huge
    # pages either way).
    ("tensorpipe negotiated, huge pages", "tensorpipe", {},
     {"THP_MEM_ALLOC_ENABLE": "1"}),
    # TensorPipe's own transports, which a stranger's bytes can crash
    # (docs/security.md): for comparison with the guarded tcp.
    ("tensorpipe uv,shm", "tensorpipe", {"tensorpipe.transports": "uv,shm"},
     {}),
    ("grpc", "grpc", {}, {}),
    # The queue threads and the waiting caller poll (backends/grpc).
    ("grpc, busy poll", "grpc", {"busy_poll_us": "100"}, {}),
    # Pinned to loopback (see the shared PLATFORM.md).
    ("libfabric tcp;ofi_rxm", "libfabric",
     {"libfabric.provider": "tcp;ofi_rxm"}, {"FI_TCP_IFACE": "lo"}),
    ("libfabric tcp;ofi_rxm, busy poll", "libfabric",
     {"libfabric.provider": "tcp;ofi_rxm", "busy_poll_us": "100"},
     {"FI_TCP_IFACE": "lo"}),
    ("libfabric shm", "libfabric", {"libfabric.provider": "shm"}, {}),
]

# Peer runs: (label, peer_bench.py arguments, also in quick mode). The
# peer is slow to start and to run: quick mode keeps its default only.
PEERS = [
    ("peer", [], True),
    ("peer uv", ["--transports", "uv", "--channels", "basic"], False),
]
# Which tether variant each peer run is compared with (like for like).
PEER_PAIRS = [("tensorpipe negotiated", "peer"),
              ("tensorpipe negotiated, busy poll", "peer"),
              ("tensorpipe uv", "peer uv")]

# Each variant's own limit: (small-call latency baseline, bandwidth baseline).
# shm and cma copy through memory: an echo moves each byte at least once per
# direction, so memcpy bounds its GB/s (counted both ways).
BASELINE_OF = {
    "tensorpipe uv": ("raw TCP", "raw TCP"),
    "tensorpipe shm": ("raw TCP", "memcpy"),
    "tensorpipe tcp": ("raw TCP", "raw TCP"),
    "tensorpipe negotiated": ("raw TCP", "memcpy"),
    "tensorpipe tcp, busy poll": ("raw TCP", "raw TCP"),
    "tensorpipe negotiated, busy poll": ("raw TCP", "memcpy"),
    "tensorpipe negotiated, huge pages": ("raw TCP", "memcpy, huge pages"),
    "tensorpipe uv,shm": ("raw TCP", "memcpy"),
    "grpc": ("bare gRPC", "bare gRPC"),
    "grpc, busy poll": ("bare gRPC", "bare gRPC"),
    "libfabric tcp;ofi_rxm": ("raw libfabric tcp;ofi_rxm",
                              "raw libfabric tcp;ofi_rxm"),
    "libfabric tcp;ofi_rxm, busy poll": ("raw libfabric tcp;ofi_rxm",
                                         "raw libfabric tcp;ofi_rxm"),
    "libfabric shm": ("raw libfabric shm", "raw libfabric shm"),
}

# The bench's targets against the peer (docs/benchmarks.md): (key, factor):
# times at least `factor` lower, rates at least `factor` higher.
PEER_TARGETS = [
    ("builtin_rpc_sync_p50_us", 10),
    ("builtin_rpc_async_calls_per_s", 10),
    ("remote_to_here_p50_us", 5),
    ("echo_64MB_GBps", 1.5),
    ("dist_autograd_step_p50_us", 5),
    # CPU per call at most the peer's.
    ("builtin_rpc_sync_cpu_us_per_call", 1),
    ("builtin_rpc_async_cpu_us_per_call", 1),
]
# Not a target: the autograd step's compute in rank 0 without RPC, measured
# alternating with the steps (bench_worker and peer_bench both report it).
LOCAL_STEP = "local_autograd_step_p50_us"
LIMIT_LATENCY_MAX = 1.5   # small-call p50 within 1.5x of the raw baseline
LIMIT_BANDWIDTH_MIN = 0.8  # 64 MiB at least 0.8x of the raw baseline

BIG = 64 << 20


# ---- locating the binaries ----

def workspace_dir():
    return os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))


def search_dirs(args):
    """Where binaries may be: --bin_dir, runfiles, the workspace's bazel-bin."""
    dirs = []
    if args.bin_dir:
        dirs.append(args.bin_dir)
    here = os.path.dirname(os.path.abspath(__file__))
    # Under `bazel run` this file is <runfiles>/tether/tools/bench.py.
    if os.path.basename(os.path.dirname(here)) == "tether":
        dirs.append(os.path.dirname(here))
    runfiles = os.environ.get("RUNFILES_DIR")
    if runfiles:
        dirs.append(os.path.join(runfiles, "tether"))
    dirs.append(os.path.join(workspace_dir(), "bazel-bin"))
    return dirs


def find_binary(args, relative):
    for d in search_dirs(args):
        path = os.path.join(d, relative)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


# ---- running ----

def run(command, timeout, env=None):
    """(returncode or None on timeout, stdout, stderr) of `command`, run in
    its own process group so that a timeout stops all of it."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return None, out, err


JSON_LINE = re.compile(r"^(?:\[0\] )?JSON (\{.*\})\s*$")


def parse_json_line(text):
    """The object of the last `JSON {...}` line (rank 0's under tether_run)."""
    found = None
    for line in text.splitlines():
        m = JSON_LINE.match(line)
        if m:
            found = json.loads(m.group(1))
    return found


def tail(text, lines=3):
    return " | ".join(t.strip() for t in text.strip().splitlines()[-lines:])


def run_two_process(args, argv, timeout, env=None):
    """bench_worker-style program under tether_run --nproc 2: its JSON."""
    command = [args.tether_run, "--nproc", "2", "--"] + argv
    code, out, err = run(command, timeout, env)
    result = parse_json_line(out)
    if result is None:
        why = "timed out after %d s" % timeout if code is None else (
            "exit %s, no JSON: %s" % (code, tail(err + out)))
        result = {"status": "failed: " + why}
    return result


# --smoke (tests only): a handful of calls per workload; numbers meaningless.
SMOKE_COUNTS = ["--sync_calls=20", "--async_calls=256", "--remote_calls=10",
                "--autograd_steps=3", "--sweep_bytes=1", "--sweep_min_iters=2",
                "--sweep_max_iters=2", "--stream_bytes=1048576",
                "--memcpy_iters=2", "--idle_ms=200"]


def common_args(args):
    """What every two-process tool gets: --quick, --max_bytes."""
    extra = ["--quick"] if args.quick else []
    if args.max_bytes:
        extra.append("--max_bytes=%d" % args.max_bytes)
    return extra


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
        results[label] = run_two_process(args, argv + worker_args(args),
                                         args.timeout, env)
        log("%-24s %-10s %5.1f s" % (label, short(results[label]["status"]),
                                     time.time() - start))
    return results


def short(status):
    return status if len(status) < 60 else status[:57] + "..."


# ---- raw baselines ----

def raw_record(label, status="ok", small_p50_us=None, bw_GBps=None,
               bw_bytes=None, sweep=None, note=""):
    return {"label": label, "status": status, "small_p50_us": small_p50_us,
            "bw_GBps": bw_GBps, "bw_bytes": bw_bytes, "sweep": sweep or [],
            "note": note}


def from_sweep(label, sweep, note=""):
    """A baseline record from sweep rows: smallest size's latency, largest
    (up to 64 MiB) size's bandwidth."""
    if not sweep:
        return raw_record(label, "failed: no rows in its output")
    big = [r for r in sweep if r["bytes"] <= BIG][-1]
    return raw_record(label, small_p50_us=sweep[0]["p50_us"],
                      bw_GBps=big["GBps"], bw_bytes=big["bytes"], sweep=sweep,
                      note=note)


def grpc_baseline(api, label):
    def measure(args, exe):
        argv = [exe, "--api=" + api] + common_args(args)
        result = run_two_process(args, argv, args.timeout)
        if result.get("status", "ok") != "ok":
            return raw_record(label, result["status"])
        if "sweep" in result:
            return from_sweep(label, result["sweep"],
                              "one stream, two processes, %s API" % api)
        return raw_record(label, "n/a: output not understood (see "
                          "tools/bench.py: parse_json_line)")
    return measure


def fabric_baseline(provider):
    def measure(args, exe):
        argv = [exe, "--provider=" + provider] + common_args(args)
        env = {"FI_TCP_IFACE": "lo"} if "tcp" in provider else {}
        result = run_two_process(args, argv, args.timeout, env)
        label = "raw libfabric " + provider
        if result.get("status", "ok") != "ok":
            return raw_record(label, result["status"])
        if "sweep" in result:
            return from_sweep(label, result["sweep"])
        return raw_record(label, "n/a: output not understood (see "
                          "tools/bench.py: parse_json_line)")
    return measure


# Pluggable: (label, binary relative to bazel-bin, measure(args, exe)).
EXTERNAL_BASELINES = [
    # The library's limit between two processes: completion queues the
    # caller's thread drives; and the callback API the backend uses.
    ("bare gRPC", "tools/grpc_pingpong", grpc_baseline("queue", "bare gRPC")),
    ("bare gRPC, callback API", "tools/grpc_pingpong",
     grpc_baseline("callback", "bare gRPC, callback API")),
    ("raw libfabric tcp;ofi_rxm", "tools/fabric_pingpong",
     fabric_baseline("tcp;ofi_rxm")),
    ("raw libfabric shm", "tools/fabric_pingpong", fabric_baseline("shm")),
]


def run_baselines(args, log):
    baselines = {}
    start = time.time()
    raw = run_two_process(args, [args.worker, "--raw"] + worker_args(args),
                          args.timeout)
    if raw.get("status") == "ok":
        baselines["raw TCP"] = raw_record(
            "raw TCP", small_p50_us=raw["tcp_pingpong_p50_us"],
            bw_GBps=raw["tcp_echo_64MB_GBps"], bw_bytes=BIG,
            sweep=raw["sweep"], note="ping-pong, TCP_NODELAY, loopback")
        baselines["raw TCP stream"] = raw_record(
            "raw TCP stream", bw_GBps=raw["tcp_stream_GBps"],
            note="one way, 1 MiB writes")
        baselines["memcpy"] = raw_record("memcpy", bw_GBps=raw["memcpy_GBps"],
                                         bw_bytes=BIG, note="one thread")
        if raw.get("tp_pipe_alone_p50_us") is not None:
            baselines["TensorPipe pipe alone"] = raw_record(
                "TensorPipe pipe alone",
                small_p50_us=raw["tp_pipe_alone_p50_us"],
                note="TensorPipe's pipe over tether's tcp transport, 128 B "
                "each way, no tether RPC code: the tensorpipe backend's "
                "floor")
        baselines["memcpy, fresh buffer"] = raw_record(
            "memcpy, fresh buffer", bw_GBps=raw["memcpy_fresh_GBps"],
            bw_bytes=BIG, note="into a buffer allocated per copy: the page "
            "faults a receiver pays per new tensor")
        baselines["memcpy, huge pages"] = raw_record(
            "memcpy, huge pages", bw_GBps=raw["memcpy_huge_pages_GBps"],
            bw_bytes=BIG, note="one thread, between buffers on transparent "
            "huge pages (as tensors are with THP_MEM_ALLOC_ENABLE=1)")
    else:
        for label in ("raw TCP", "raw TCP stream", "memcpy",
                      "memcpy, fresh buffer", "memcpy, huge pages"):
            baselines[label] = raw_record(label, raw.get("status", "failed"))
    log("%-24s %-10s %5.1f s" % ("raw TCP, memcpy", short(raw["status"]),
                                 time.time() - start))
    for label, relative, measure in EXTERNAL_BASELINES:
        start = time.time()
        exe = find_binary(args, relative)
        if exe is None:
            baselines[label] = raw_record(
                label, "n/a: %s is not built (bazel build -c opt //%s:%s)"
                % (relative, *relative.rsplit("/", 1)))
        else:
            baselines[label] = measure(args, exe)
        log("%-24s %-10s %5.1f s" % (label, short(baselines[label]["status"]),
                                     time.time() - start))
    return baselines


# ---- the peer ----

def run_peers(args, log):
    peers = {}
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "peer_bench.py")
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
        code, out, err = run(argv, args.timeout)
        result = parse_json_line(out) or {
            "status": "failed: exit %s: %s" % (code, tail(err))}
        peers[label] = result
        log("%-24s %-10s %5.1f s" % (label, short(result["status"]),
                                     time.time() - start))
    return peers


# ---- repeats ----

def median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def merge_runs(records):
    """One record from the same run repeated: each number the median over
    the repeats that succeeded (sweep rows by size); the first failure's
    status if none did."""
    good = [r for r in records if r.get("status") == "ok"]
    if not good:
        return records[0]
    merged = dict(good[0])
    for key, value in good[0].items():
        values = [r.get(key) for r in good]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in values):
            merged[key] = median(values)
    if good[0].get("sweep"):
        rows = []
        for row in good[0]["sweep"]:
            same = [x for r in good for x in r.get("sweep", [])
                    if x["bytes"] == row["bytes"]]
            rows.append(merge_runs([dict(x, status="ok") for x in same]))
            rows[-1].pop("status")
        merged["sweep"] = rows
    if len(records) > 1:
        merged["repeats_ok"] = "%d of %d" % (len(good), len(records))
    return merged


# ---- tables ----

def human_bytes(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return "%d %s" % (n // size, unit)
    return "%d B" % n


def fmt(value, unit=""):
    if value is None:
        return "n/a"
    if unit == "calls/s":
        return "%.0f" % value
    if unit == "us":
        return "%.1f" % value if value < 1000 else "%.0f" % value
    if abs(value) >= 100:
        return "%.0f" % value
    return "%.2f" % value if abs(value) >= 0.1 else "%.3g" % value


def ok(result):
    return result is not None and result.get("status") == "ok"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def gain(key, tether, peer):
    """How many times better tether is than the peer on `key`."""
    better = dict((k, b) for k, _, _, b in WORKLOADS)[key]
    if tether is None or peer is None:
        return None
    return ratio(peer, tether) if better == "lower" else ratio(tether, peer)


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def workload_table(results):
    variants = [l for l, *_ in VARIANTS if ok(results["variants"].get(l))]
    peers = [l for l, *_ in PEERS if ok(results["peers"].get(l))]
    pairs = [(t, p) for t, p in PEER_PAIRS if t in variants and p in peers]
    header = ["workload"] + variants + peers + [
        "%s / %s" % (t.replace("tensorpipe ", "tp "), p) for t, p in pairs]
    rows = []
    for key, label, unit, _ in WORKLOADS + [
            (LOCAL_STEP, "(its compute alone, no RPC)", "us", "lower")]:
        row = ["%s (%s)" % (label, unit)]
        row += [fmt(results["variants"][v].get(key), unit) for v in variants]
        row += [fmt(results["peers"][p].get(key), unit) for p in peers]
        for t, p in pairs:
            r = ratio(results["variants"][t].get(key),
                      results["peers"][p].get(key))
            row.append("n/a" if r is None else "%.3g" % r)
        rows.append(row)
    return markdown(header, rows)


def limit_rows(results):
    """Each variant against its own raw baseline."""
    rows = []
    for label, *_ in VARIANTS:
        v = results["variants"].get(label)
        if not ok(v):
            continue
        lat_base, bw_base = BASELINE_OF[label]
        lb = results["baselines"].get(lat_base, {})
        bb = results["baselines"].get(bw_base, {})
        lat = ratio(v.get("builtin_rpc_sync_p50_us"), lb.get("small_p50_us"))
        # At the baseline's largest size when it stops short of 64 MiB.
        bw_bytes = bb.get("bw_bytes") or BIG
        at_size = [r["GBps"] for r in v.get("sweep", [])
                   if r["bytes"] == bw_bytes]
        bw_value = at_size[0] if at_size else v.get("echo_64MB_GBps")
        bw = ratio(bw_value, bb.get("bw_GBps"))
        rows.append({
            "variant": label,
            "latency_us": v.get("builtin_rpc_sync_p50_us"),
            "latency_baseline": lat_base,
            "latency_baseline_us": lb.get("small_p50_us"),
            "latency_ratio": lat,
            "latency_met": None if lat is None else lat <= LIMIT_LATENCY_MAX,
            "bandwidth_bytes": bw_bytes if at_size else BIG,
            "bandwidth_GBps": bw_value,
            "bandwidth_baseline": bw_base,
            "bandwidth_baseline_GBps": bb.get("bw_GBps"),
            "bandwidth_ratio": bw,
            "bandwidth_met": None if bw is None else bw >= LIMIT_BANDWIDTH_MIN,
        })
    return rows


def verdict(met):
    return "n/a" if met is None else ("met" if met else "**missed**")


def limit_table(rows):
    header = ["variant", "rpc_sync p50 us", "raw baseline", "ratio (<= %.1f)"
              % LIMIT_LATENCY_MAX, "", "echo GB/s", "raw baseline",
              "ratio (>= %.1f)" % LIMIT_BANDWIDTH_MIN, ""]
    out = []
    for r in rows:
        out.append([
            r["variant"], fmt(r["latency_us"], "us"),
            "%s %s" % (r["latency_baseline"],
                       fmt(r["latency_baseline_us"], "us")),
            fmt(r["latency_ratio"]), verdict(r["latency_met"]),
            "%s (%s)" % (fmt(r["bandwidth_GBps"]),
                         human_bytes(r["bandwidth_bytes"])),
            "%s %s" % (r["bandwidth_baseline"],
                       fmt(r["bandwidth_baseline_GBps"])),
            fmt(r["bandwidth_ratio"]), verdict(r["bandwidth_met"])])
    return markdown(header, out)


def peer_rows(results):
    rows = []
    for t, p in PEER_PAIRS:
        tv, pv = results["variants"].get(t), results["peers"].get(p)
        for key, factor in PEER_TARGETS:
            g = gain(key, tv.get(key) if ok(tv) else None,
                     pv.get(key) if ok(pv) else None)
            rows.append({"tether": t, "peer": p, "key": key,
                         "tether_value": tv.get(key) if ok(tv) else None,
                         "peer_value": pv.get(key) if ok(pv) else None,
                         "gain": g, "target": factor,
                         "met": None if g is None else g >= factor,
                         "note": peer_note(key, tv, pv)})
    return rows


def peer_note(key, tether, peer):
    """What bounds a gain whatever tether does: the step's own compute,
    measured in tether's rank 0 alternating with its steps."""
    if key != "dist_autograd_step_p50_us" or not ok(tether) or not ok(peer):
        return ""
    floor = tether.get(LOCAL_STEP)
    if not floor:
        return ""
    return "compute alone %s us: at most %.1fx possible" % (
        fmt(floor, "us"), peer[key] / floor)


def peer_table(rows):
    units = dict((k, u) for k, _, u, _ in WORKLOADS)
    labels = dict((k, l) for k, l, _, _ in WORKLOADS)
    out = []
    for r in rows:
        u = units[r["key"]]
        out.append(["%s vs %s" % (r["tether"], r["peer"]), labels[r["key"]],
                    fmt(r["tether_value"], u), fmt(r["peer_value"], u),
                    "n/a" if r["gain"] is None else "%.2fx" % r["gain"],
                    ">= %gx" % r["target"], verdict(r["met"]),
                    r.get("note", "")])
    return markdown(["pair", "workload", "tether", "peer", "better by",
                     "target", "", "note"], out)


def baseline_table(results):
    out = []
    for label, b in results["baselines"].items():
        if b["status"] != "ok":
            out.append([label, "n/a", "n/a", b["status"]])
            continue
        bw = fmt(b["bw_GBps"])
        if b.get("bw_bytes"):
            bw += " (%s)" % human_bytes(b["bw_bytes"])
        out.append([label, fmt(b["small_p50_us"], "us"), bw, b["note"]])
    return markdown(["raw baseline", "p50 us (round trip; step)", "GB/s",
                     "note"], out)


def not_available(results):
    lines = []
    for group in ("variants", "peers"):
        for label, r in results[group].items():
            if not ok(r):
                lines.append("- %s: %s" % (label, r.get("status")))
    return "\n".join(lines)


def report(results):
    if results.get("variants") is None:
        return scale_report(results["scale"]) + "\n"
    host = results.get("host", {})
    parts = ["%s run%s, %s, %s CPUs, load average %s at start, %s at end, "
             "%.0f s." % ("quick" if results["quick"] else "full",
                          " (medians of %d rounds)" % results["repeat"]
                          if results.get("repeat", 1) > 1 else "",
                          results.get("date", "?"), host.get("cpus", "?"),
                          fmt(host.get("loadavg_at_start")),
                          fmt(host.get("loadavg_at_end")),
                          results.get("seconds", 0)), "",
             "## Workloads (two processes, rank 0 -> rank 1)", "",
             workload_table(results), "",
             "## Against each backend's own raw baseline", "",
             limit_table(results["limits"]), "",
             "## Against the peer (the bench's targets)", "",
             peer_table(results["peer_targets"]), "",
             "## Raw baselines", "", baseline_table(results)]
    missing = not_available(results)
    if missing:
        parts += ["", "## Not measured", "", missing]
    if results.get("scale"):
        parts += ["", scale_report(results["scale"])]
    return "\n".join(parts) + "\n"


def scale_report(scale):
    return "\n".join([
        "## Scale: `%s`, %s, load average %s at start, %s at end, "
        "%.0f s" % (scale["command"], scale["date"],
                    fmt(scale["loadavg_at_start"]),
                    fmt(scale["loadavg_at_end"]), scale["seconds"]), "",
        bench_scale.scale_table(scale)])


# ---- plots ----

def plot(results, out_dir):
    paths = []
    if results.get("scale"):
        paths += bench_scale.plot_scale(results["scale"], out_dir)
    if results.get("variants") is not None:
        paths += plot_sweeps(results, out_dir)
        paths += plot_cpu(results, out_dir)
    return paths


def plot_cpu(results, out_dir):
    """cpu.png: CPU per call and idle CPU, per variant and peer."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("tether " + label, r) for label, r in results["variants"].items()
            if ok(r) and r.get(CPU_KEYS[0]) is not None]
    rows += [("torch.distributed.rpc " + label[5:].strip(), r)
             for label, r in results["peers"].items()
             if ok(r) and r.get(CPU_KEYS[0]) is not None]
    if not rows:
        return []
    labels = dict((k, l) for k, l, _, _ in WORKLOADS)
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.5 + 0.35 * len(rows)),
                             dpi=80, sharey=True)
    for ax, keys, xlabel in (
            (axes[0], CPU_KEYS[:2], "CPU per call, both processes (us)"),
            (axes[1], CPU_KEYS[2:], "idle CPU per process (% of a core)")):
        height = 0.8 / len(keys)
        for i, key in enumerate(keys):
            ax.barh([n + i * height for n in range(len(rows))],
                    [r.get(key) or 0 for _, r in rows], height=height,
                    label=labels[key])
        ax.set_xlabel(xlabel)
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_yticks([n + 0.4 - 0.2 for n in range(len(rows))])
    axes[0].set_yticklabels([name for name, _ in rows], fontsize=7)
    axes[0].invert_yaxis()
    fig.tight_layout()
    path = os.path.join(out_dir, "cpu.png")
    fig.savefig(path)
    plt.close(fig)
    return [path]


def plot_sweeps(results, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = []
    for group in ("variants", "peers"):
        for label, r in results[group].items():
            if ok(r) and r.get("sweep"):
                name = ("torch.distributed.rpc " + label[5:].strip()
                        if group == "peers" else "tether " + label)
                series.append((name.strip(), r["sweep"], "-"))
    for label, b in results["baselines"].items():
        if b["status"] == "ok" and b["sweep"]:
            series.append((label, b["sweep"], "--"))
    paths = []
    for name, key, ylabel in (
            ("latency_vs_size.png", "p50_us", "round trip p50 (us)"),
            ("bandwidth_vs_size.png", "GBps", "GB/s (both ways)")):
        fig, ax = plt.subplots(figsize=(8, 5), dpi=80)
        for label, sweep, style in series:
            ax.plot([r["bytes"] for r in sweep], [r[key] for r in sweep],
                    style, marker="o", markersize=3, label=label)
        for label, style in (("memcpy", ":"), ("memcpy, fresh buffer", "-."),
                             ("memcpy, huge pages", "--")):
            copy = results["baselines"].get(label, {})
            if key == "GBps" and copy.get("status") == "ok":
                ax.axhline(copy["bw_GBps"], color="grey", linestyle=style,
                           label="%s, 64 MiB (one thread)" % label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("payload (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title("echo of a tensor between two processes (%s%s)"
                     % ("quick" if results["quick"] else "full",
                        ", medians of %d rounds" % results["repeat"]
                        if results.get("repeat", 1) > 1 else ""))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_anywhere(args, results_path, out_dir, log):
    """Plots here if matplotlib imports, else under --python."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if not os.path.exists(args.python):
            log("plots: no matplotlib (scripts/bench_setup.sh installs "
                "python3-matplotlib)")
            return
        code, out, err = run([args.python, os.path.abspath(__file__),
                              "--plot_only", results_path, "--out", out_dir],
                             300)
        log(out.strip() if code == 0 else "plots failed: " + tail(err))
        return
    with open(results_path) as f:
        results = json.load(f)
    for path in plot(results, out_dir):
        log("wrote " + path)


# ---- main ----

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
        bench_scale.pick_variants(VARIANTS, args.backends)
    except ValueError as e:
        log("bench: %s" % e)
        return 2
    started = time.time()
    load = os.getloadavg()[0]
    scale = bench_scale.run_scale(args, VARIANTS, run, tail, log)
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
    results["scale"] = bench_scale.merge_scale(results.get("scale"), scale)
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
    parser.add_argument("--scale", default=None, type=bench_scale.parse_sizes,
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
