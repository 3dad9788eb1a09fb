#!/usr/bin/env bash
# Installs what is missing, then runs the whole default test suite.
# Extra arguments go to `bazel test` (e.g. --config=asan).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
config=()
if [ "${CI:-}" = "true" ]; then config=(--config=ci); fi
bazel test "${config[@]}" "$@" //...
