#!/usr/bin/env bash
# Installs the Debian 12 packages tether builds and tests with, plus any
# packages named as arguments (scripts/bench_setup.sh adds the benchmarks').
# Idempotent: does nothing (and needs no network) when they are all present.
set -euo pipefail

packages=(
  bazel-bootstrap
  g++
  libtorch-dev
  # LibTorch's BLAS: the threaded OpenBLAS, which is safe for the
  # concurrent calls a worker's handlers make; the serial one that
  # libtorch-dev brings gives wrong results then (core/internal/blas_check.h).
  # Installed, it becomes the system's libblas.so.3 (Debian's alternatives).
  libopenblas0-pthread
  libabsl-dev
  libprotobuf-dev
  protobuf-compiler
  libgrpc++-dev
  protobuf-compiler-grpc
  libtensorpipe-dev
  libfabric-dev
  libgoogle-glog-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libssl-dev
  iproute2
  # Launchers users already have, which the tests run the main job under
  # (torchrun comes with python3-torch below).
  openmpi-bin
  # tether from a CMake project (//cmake:install, testing/outside).
  cmake
  pkg-config
  # The Python front end (python/, scripts/python_setup.sh).
  python3-dev
  pybind11-dev
  python3-torch
  python3-pytest
  # The wheel: virtual environments with pip (scripts/python_install.sh,
  # //python:wheel_test) and mypy's stubtest (//python:stubs_test).
  python3-venv
  python3-mypy
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
