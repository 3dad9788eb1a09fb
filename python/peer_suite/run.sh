#!/usr/bin/env bash
# Runs peer_suite.run under Debian's python3 (the interpreter with torch
# and the peer's test suites) with the built tether package on the path.
set -euo pipefail
here="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tether}"
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
exec /usr/bin/python3 -m peer_suite.run "$@"
