#!/usr/bin/env bash
# No tether binary needs libfabric: each file given (programs, the Python
# extension, the CMake package's libtether.so) has no DT_NEEDED entry for
# it, none of the libraries it needs pulls it in, and it leaves no libfabric
# function (fi_*) for the loader to bind. The libfabric backend opens
# libfabric.so.1 itself, only when a worker chooses it
# (backends/libfabric/internal/fabric_library.h): Debian's library needs the
# PSM providers, whose constructor installs signal handlers in every process
# that loads it (docs/reliability.md, "Signals").
set -euo pipefail

failed=0
for file in "$@"; do
  name="${file##*/}"
  this_failed=0
  needed="$(readelf -d "$file" | grep '(NEEDED)' || true)"
  if [[ "$needed" == *libfabric* ]]; then
    echo "FAIL: $name needs libfabric:"
    grep libfabric <<<"$needed"
    this_failed=1
  fi
  if ldd "$file" | grep -q 'libfabric\|libpsm\|libinfinipath'; then
    echo "FAIL: a library $name needs pulls in libfabric or PSM:"
    ldd "$file" | grep 'libfabric\|libpsm\|libinfinipath'
    this_failed=1
  fi
  undefined="$(nm -D --undefined-only "$file" | grep -E ' fi_[a-z_]+' || true)"
  if [[ -n "$undefined" ]]; then
    echo "FAIL: $name leaves libfabric functions to the loader:"
    echo "$undefined"
    this_failed=1
  fi
  if [[ "$this_failed" == 1 ]]; then failed=1; else echo "ok: $name"; fi
done
exit "$failed"
