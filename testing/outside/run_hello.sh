#!/usr/bin/env bash
# Runs the outside project's program (project/hello.cc), however it was
# built, as two workers under tether_run and checks what each says:
#   run_hello.sh TETHER_RUN HELLO
set -euo pipefail
# Under --config=asan: the ASan runtime first (testing/with_asan_runtime.sh).
[[ -z "${TETHER_ASAN_RUNTIME:-}" ]] || export LD_PRELOAD="$TETHER_ASAN_RUNTIME"
out="$(timeout 120 "$1" --nproc 2 -- "$2" 2>&1)" || {
  echo "$out"
  echo "FAIL: $2 failed" >&2
  exit 1
}
echo "$out"
for who in "worker0: worker1" "worker1: worker0"; do
  grep -q "$who added and multiplied" <<<"$out" || {
    echo "FAIL: $2: no line '$who added and multiplied'" >&2
    exit 1
  }
done
