#!/usr/bin/env bash
# Runs the layering check's tests under Debian's python3.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
here="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tether}"
exec /usr/bin/python3 "$here/testing/layering/layering_test.py"
