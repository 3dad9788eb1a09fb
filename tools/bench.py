#!/usr/bin/env python3
"""bench: tether's benchmarks across backends, raw baselines and the peer.

The entry of the bench CLI (tools/benchlib; `tools/bench.py --help`):

    bazel run -c opt //tools:bench -- [--quick] [--out DIR]
    tools/bench.py --bin_dir bazel-out/k8-opt/bin [--quick] [--out DIR]
"""
import sys

from benchlib import cli  # beside this script

if __name__ == "__main__":
    sys.exit(cli.main())
