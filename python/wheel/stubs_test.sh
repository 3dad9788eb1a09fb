#!/usr/bin/env bash
# tether's type stubs (python/tether/**/*.pyi) against the package: mypy's
# stubtest imports each public module and fails on a name the stub lacks or
# invents, or a signature (of the Python functions) that differs.
set -euo pipefail
here="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tether}"
export PYTHONPATH="$here/python"
export PYTHONDONTWRITEBYTECODE=1
export MYPY_CACHE_DIR="${TEST_TMPDIR:-$(mktemp -d)}/mypy_cache"
cd "${TEST_TMPDIR:-/tmp}"
exec /usr/bin/python3 -m mypy.stubtest \
  --mypy-config-file "$here/python/wheel/stubtest.ini" \
  --allowlist "$here/python/wheel/stubtest_allowlist.txt" \
  tether.rpc tether.autograd tether.optim tether.nn
