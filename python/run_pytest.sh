#!/usr/bin/env bash
# Runs one pytest file under Debian's python3 (the interpreter with torch)
# with the built tether package first on the path.
set -euo pipefail
here="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tether}"
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
# Under --config=asan: the ASan runtime first (testing/with_asan_runtime.sh).
[[ -z "${TETHER_ASAN_RUNTIME:-}" ]] || export LD_PRELOAD="$TETHER_ASAN_RUNTIME"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@"
