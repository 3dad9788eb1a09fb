#!/usr/bin/env bash
# Runs a test with TSAN_OPTIONS pointing at testing/tsan.supp by an absolute
# path (TSan resolves relative paths against the test's own folder).
# Used by `--config=tsan` through --run_under.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
supp=""
for candidate in "$here/tsan.supp" "${RUNFILES_DIR:-$0.runfiles}/tether/testing/tsan.supp" \
    "$0.runfiles/tether/testing/tsan.supp"; do
  if [ -f "$candidate" ]; then supp="$candidate"; break; fi
done
[ -n "$supp" ] || { echo "with_tsan_suppressions: tsan.supp not found" >&2; exit 1; }
export TSAN_OPTIONS="suppressions=$supp halt_on_error=1 report_signal_unsafe=0 ${TSAN_OPTIONS:-}"
exec "$@"
