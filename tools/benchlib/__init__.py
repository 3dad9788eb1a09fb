"""The bench CLI's modules (tools/bench.py is its entry; cli.py says what
it does and how to run it), one job each:

  variants    the workloads, backend variants, peer runs, baselines of each
              variant and the targets
  processes   finding the tools' binaries, running them, reading their JSON
  workers     each variant's workloads in a pair of bench_worker processes
  baselines   the raw baselines (bench_worker --raw and EXTERNAL_BASELINES)
  peers       the same workloads on torch.distributed.rpc (peer_bench.py)
  scale       the scale workload: N scale_worker processes per world size
  results     medians over rounds; rows against baselines and the peer
  formatting  how numbers, sizes and verdicts are written
  tables      the Markdown report
  plots       the PNG plots
  cli         the flags and main()
  python_rpc  what the Python benches on the RPC API share (peer_bench.py,
              py_bench.py): CPU of both ends of a call

Nothing here imports torch or matplotlib at import time: peer_bench.py and
py_bench.py import python_rpc under Debian's /usr/bin/python3.
"""
