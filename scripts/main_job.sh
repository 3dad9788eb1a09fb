#!/usr/bin/env bash
# Installs what is missing, then runs the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
bazel run //examples:hello_loopback -- "$@"
