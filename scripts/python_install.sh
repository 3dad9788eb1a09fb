#!/usr/bin/env bash
# Installs tether as Python packages are installed: builds the wheel with
# Bazel (-c opt, //python:wheel), makes the virtual environment VENV with
# Debian's python3 and --system-site-packages (so python3-torch is seen)
# unless it exists, and installs the wheel into it with pip, offline.
#
#   scripts/python_install.sh VENV && VENV/bin/python -c "import tether.rpc"
#
# Run it again after a change: the installed tether is replaced. `VENV/bin/
# pip uninstall tether` removes it. docs/python.md, "Installing".
set -euo pipefail

if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: scripts/python_install.sh VENV" >&2
  exit 2
fi
venv="$(realpath -m "$1")"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

scripts/setup.sh
bazel build -c opt --jobs="${TETHER_JOBS:-2}" //python:wheel
version="$(sed -n 's/^TETHER_VERSION = "\(.*\)"$/\1/p' tether/version.bzl)"
wheel="bazel-bin/python/tether-$version-cp311-cp311-linux_x86_64.whl"
if [ ! -f "$wheel" ]; then
  echo "python_install: Bazel built no $wheel" >&2
  exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The same version built again replaces the installed one.
if "$venv/bin/python" -m pip show -q tether 2>/dev/null; then
  "$venv/bin/python" -m pip uninstall -q -y tether
fi
"$venv/bin/python" -m pip install -q --no-index "$wheel"
echo "python_install: $(basename "$wheel") in $venv"
