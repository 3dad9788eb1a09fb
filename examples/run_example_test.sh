#!/usr/bin/env bash
# Runs an example binary and checks that it says its result matches.
set -euo pipefail
out=$("$1")
echo "$out"
grep -q "matches local" <<<"$out"
