"""The raw baselines: each fabric's own limit between the same two
processes, without tether (bench_worker --raw: TCP, memcpy, TensorPipe's
pipe alone; and the tools in EXTERNAL_BASELINES, "n/a" when not built)."""
import time

from .hosts import BASELINES_NOT_ACROSS
from .processes import common_args, find_binary, run_two_process, short
from .variants import BIG
from .workers import worker_args


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
                          "tools/benchlib/processes.py: parse_json_line)")
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
                          "tools/benchlib/processes.py: parse_json_line)")
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


RAW_LABELS = ["raw TCP", "raw TCP stream", "memcpy", "memcpy, fresh buffer",
              "memcpy, huge pages"]


def run_baselines(args, log):
    baselines = {}
    start = time.time()
    raw = run_two_process(args, [args.worker, "--raw"] + worker_args(args),
                          args.timeout)
    if raw.get("status") == "ok":
        baselines["raw TCP"] = raw_record(
            "raw TCP", small_p50_us=raw["tcp_pingpong_p50_us"],
            bw_GBps=raw["tcp_echo_64MB_GBps"], bw_bytes=BIG,
            sweep=raw["sweep"], note="ping-pong, TCP_NODELAY, %s"
            % ("between the hosts" if args.hosts else "loopback"))
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
                "each way, no tether RPC code: what a small call would "
                "cost through the pipe, which small calls go around")
        baselines["memcpy, fresh buffer"] = raw_record(
            "memcpy, fresh buffer", bw_GBps=raw["memcpy_fresh_GBps"],
            bw_bytes=BIG, note="into a buffer allocated per copy: the page "
            "faults a receiver pays per new tensor")
        baselines["memcpy, huge pages"] = raw_record(
            "memcpy, huge pages", bw_GBps=raw["memcpy_huge_pages_GBps"],
            bw_bytes=BIG, note="one thread, between buffers on transparent "
            "huge pages (as tensors are with THP_MEM_ALLOC_ENABLE=1)")
    else:
        for label in RAW_LABELS:
            baselines[label] = raw_record(label, raw.get("status", "failed"))
    log("%-24s %-10s %5.1f s" % ("raw TCP, memcpy", short(raw["status"]),
                                 time.time() - start))
    for label, relative, measure in EXTERNAL_BASELINES:
        start = time.time()
        exe = find_binary(args, relative)
        if args.hosts:
            baselines[label] = raw_record(label, BASELINES_NOT_ACROSS)
        elif exe is None:
            baselines[label] = raw_record(
                label, "n/a: %s is not built (bazel build -c opt //%s:%s)"
                % (relative, *relative.rsplit("/", 1)))
        else:
            baselines[label] = measure(args, exe)
        log("%-24s %-10s %5.1f s" % (label, short(baselines[label]["status"]),
                                     time.time() - start))
    return baselines
