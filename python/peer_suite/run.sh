#!/usr/bin/env bash
# Runs peer_suite.run under Debian's python3 (the interpreter with torch
# and the peer's test suites) with the built tether package on the path.
set -euo pipefail
here="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tether}"
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
# Under `bazel test`, the workers' output (with the peer harness's
# tracebacks of a test that timed out) is kept with the test's outputs.
if [[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]]; then
  set -- --log "$TEST_UNDECLARED_OUTPUTS_DIR/workers.log" "$@"
fi
# Under --config=asan: the ASan runtime first (testing/with_asan_runtime.sh).
[[ -z "${TETHER_ASAN_RUNTIME:-}" ]] || export LD_PRELOAD="$TETHER_ASAN_RUNTIME"
exec /usr/bin/python3 -m peer_suite.run "$@"
