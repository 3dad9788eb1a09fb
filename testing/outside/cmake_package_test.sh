#!/usr/bin/env bash
# CMake users' way in: installs tether with //cmake:install, configures and
# builds a tiny CMake project (cmake_project/) with find_package(tether), and
# runs its program as two workers under tether_run (on the default backend,
# then on gRPC through the installed plugin); then compiles and links
# the same program with the flags `pkg-config tether` prints.
#
#   cmake_package_test.sh INSTALL TETHER_RUN CMAKELISTS HELLO_CC
set -euo pipefail

install="$1"
tether_run="$(readlink -f "$2")"
cmakelists="$(readlink -f "$3")"
hello_cc="$(readlink -f "$4")"
run_hello="$(cd "$(dirname "$0")" && pwd)/run_hello.sh"
work="${TEST_TMPDIR:-$(mktemp -d)}"

prefix="$work/prefix"
rm -rf "$prefix" "$work/src" "$work/build"
# The install script finds its files in the runfiles, which this test's
# include (as under `bazel run`).
RUNFILES_DIR="${TEST_SRCDIR:-$PWD/..}" "$install" "$prefix"
for f in lib/libtether.so lib/libtether_grpc.so include/tether/tether.h \
         include/core/rpc.h lib/cmake/tether/tetherConfig.cmake \
         lib/pkgconfig/tether.pc; do
  [ -f "$prefix/$f" ] || { echo "FAIL: the installed tree lacks $f" >&2; exit 1; }
done

mkdir -p "$work/src"
cp "$cmakelists" "$work/src/CMakeLists.txt"
cp "$hello_cc" "$work/src/hello.cc"
cmake -S "$work/src" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release
cmake --build "$work/build" -j 2

"$run_hello" "$tether_run" "$work/build/hello"
# On gRPC, whose plugin libtether.so finds beside itself (not in this
# test's runfiles: the variables that point there are unset).
env -u RUNFILES_DIR -u TEST_SRCDIR TETHER_BACKEND=grpc \
  "$run_hello" "$tether_run" "$work/build/hello"

# pkg-config users.
flags="$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs tether)"
# shellcheck disable=SC2086  # the flags are words
g++ -O1 -o "$work/hello_pc" "$hello_cc" $flags
"$run_hello" "$tether_run" "$work/hello_pc"
echo "PASS"
