"""What the bench runs and what it holds each run to.

The workloads (the keys of every variant's and peer's record), the backend
variants, the peer runs and their like-for-like pairs, each variant's own
raw baseline, and the targets (docs/benchmarks.md).
"""

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
