#!/usr/bin/env bash
# A user's own Bazel workspace (project/: WORKSPACE.in, BUILD.in, hello.cc)
# that depends on tether with local_repository and tether_dependencies(),
# and nothing else: no copy of tether's rules, repositories or .bazelrc.
# Builds its program in each MODE given with a nested Bazel, and runs
# each build's program as two workers under tether_run (built from the
# same external repository) over the default backend.
#
#   outside_workspace_test.sh TETHER_WORKSPACE_FILE PROJECT_WORKSPACE_IN MODE...
#
# MODE is a compilation mode (fastbuild, opt); each is built and run.
#
# The nested Bazel has its own output root (in the test's temporary folder,
# so runs never share one) and reads only the system bazelrc (Debian's
# install base); it uses the shared disk cache named in tether's .bazelrc, so
# a warm run fetches what an earlier run compiled instead of compiling tether
# again.
set -euo pipefail

tether_root="$(dirname "$(readlink -f "$1")")"
project="$(dirname "$(readlink -f "$2")")"
shift 2
modes=("$@")
if [[ ${#modes[@]} -eq 0 ]]; then
  echo "FAIL: no compilation mode given" >&2
  exit 1
fi
run_hello="$(cd "$(dirname "$0")" && pwd)/run_hello.sh"
work="${TEST_TMPDIR:-$(mktemp -d)}"
home="$(getent passwd "$(id -u)" | cut -d: -f6)"
disk_cache="$(sed -n 's/^build --disk_cache=//p' "$tether_root/.bazelrc")"
disk_cache="${disk_cache/#\~/$home}"

ws="$work/my_project"
rm -rf "$ws"
mkdir -p "$ws"
sed "s|@TETHER_PATH@|$tether_root|" "$project/WORKSPACE.in" >"$ws/WORKSPACE"
cp "$project/BUILD.in" "$ws/BUILD"
cp "$project/hello.cc" "$ws/hello.cc"
if grep -q "@TETHER_PATH@" "$ws/WORKSPACE"; then
  echo "FAIL: the WORKSPACE still names no tether folder" >&2
  exit 1
fi

nested=(bazel --output_user_root="$work/bazel_root" --nohome_rc
        --max_idle_secs=120)
cleanup() { (cd "$ws" && "${nested[@]}" shutdown) >/dev/null 2>&1 || true; }
trap cleanup EXIT

# Only the test's own plumbing: the shared cache, a quiet spawn strategy
# (linux-sandbox prints pages of debug lines with this Bazel), 2 jobs, and a
# fixed PATH for the actions (the caller's PATH would otherwise be part of
# every action's cache key, and differ between a shell and a Bazel test).
flags=(--disk_cache="$disk_cache" --spawn_strategy=local
       --genrule_strategy=local --jobs=2 --color=no --curses=no
       --show_progress_rate_limit=60 --incompatible_strict_action_env)

for mode in "${modes[@]}"; do
  start=$(date +%s)
  (cd "$ws" && "${nested[@]}" build "${flags[@]}" -c "$mode" \
      //:hello @tether//tools:tether_run)
  bin="$(cd "$ws" && "${nested[@]}" info "${flags[@]}" -c "$mode" bazel-bin 2>/dev/null)"
  echo "outside workspace: -c $mode built in $(( $(date +%s) - start )) s"
  # tether_run serves the store on a port the kernel picks.
  "$run_hello" "$bin/external/tether/tools/tether_run" "$bin/hello"
done
echo "PASS"
