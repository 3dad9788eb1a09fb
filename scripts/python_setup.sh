#!/usr/bin/env bash
# The developer's shortcut (users install the wheel: scripts/python_install.sh):
# makes `import tether` work for Debian's python3 (/usr/bin/python3, which
# has python3-torch) from the checkout itself: installs the Debian packages,
# builds the extension tether._C, the gRPC backend's plugin
# libtether_grpc.so, tether/_build.py and the launcher with
# Bazel, puts them beside the package sources in python/tether/ (untracked)
# and points Debian's site-packages at python/ with a .pth file (no pip, no
# download). Edits of the .py files take effect at once; run it again after
# a C++ change.
#
#   scripts/python_setup.sh            # optimised build (-c opt)
#   TETHER_PY_MODE=fastbuild scripts/python_setup.sh   # reuse test builds
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python=/usr/bin/python3

scripts/setup.sh

bazel build -c "${TETHER_PY_MODE:-opt}" --jobs="${TETHER_JOBS:-2}" \
  //python:tether/_C.so //python:tether/libtether_grpc.so \
  //python:tether/_build.py //tools:tether_run
install -m 0755 "bazel-bin/python/tether/_C.so" python/tether/_C.so
install -m 0755 "bazel-bin/python/tether/libtether_grpc.so" \
  python/tether/libtether_grpc.so
install -m 0644 "bazel-bin/python/tether/_build.py" python/tether/_build.py
install -D -m 0755 "bazel-bin/tools/tether_run" python/tether/bin/tether_run

site="$("$python" -c 'import site; print(site.getsitepackages()[0])')"
if ! { mkdir -p "$site" && [ -w "$site" ]; }; then
  site="$("$python" -m site --user-site)"
  mkdir -p "$site"
fi
echo "$repo/python" > "$site/tether.pth"
echo "python_setup: $site/tether.pth -> $repo/python"

cd /
"$python" -c 'import tether.rpc, tether; print("python_setup: import tether OK:", tether.__file__)'
