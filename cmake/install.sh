#!/usr/bin/env bash
# Writes an installed tether tree for CMake and pkg-config users:
#
#   bazel run //cmake:install -- PREFIX
#
#   PREFIX/lib/libtether.so                every layer, one shared library
#   PREFIX/lib/libtether_grpc.so           the gRPC backend, which libtether.so
#                                          loads when a worker chooses "grpc"
#   PREFIX/include/...                     tether's headers (tether/tether.h)
#   PREFIX/lib/cmake/tether/tetherConfig.cmake    find_package(tether)
#   PREFIX/lib/pkgconfig/tether.pc                pkg-config tether
#
# PREFIX must be absolute or relative to the folder `bazel run` was started
# from. An existing tree is replaced file by file.
set -euo pipefail

usage() { echo "usage: bazel run //cmake:install -- PREFIX" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in -h|--help) usage ;; esac
prefix="$1"
if [ "${prefix#/}" = "$prefix" ]; then
  prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix"
fi

runfiles="${RUNFILES_DIR:-$0.runfiles}"
# tether's own files in the runfiles: its workspace's folder, whether tether
# is the main workspace or a dependency of the user's.
here="$runfiles/tether"
if [ ! -d "$here/cmake" ]; then
  echo "install: cannot find tether's files in $runfiles" >&2
  exit 1
fi

mkdir -p "$prefix/lib/cmake/tether" "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$here/cmake/libtether.so" "$prefix/lib/libtether.so"
# Beside libtether.so, where its loader looks (backends/common/plugin_library.h).
install -m 0755 "$here/backends/grpc/libtether_grpc.so" \
  "$prefix/lib/libtether_grpc.so"
count=0
while IFS= read -r header; do
  [ -n "$header" ] || continue
  header="${header#../tether/}"  # tether as an external repository
  install -D -m 0644 "$here/$header" "$prefix/include/$header"
  count=$((count + 1))
done <"$here/cmake/headers.txt"
if [ "$count" -eq 0 ]; then
  echo "install: the header manifest is empty" >&2
  exit 1
fi
install -m 0644 "$here/cmake/tetherConfig.cmake.in" \
  "$prefix/lib/cmake/tether/tetherConfig.cmake"
# The version: tether/version.h's, which Bazel writes from tether/version.bzl.
version="$(sed -n 's/^#define TETHER_VERSION "\(.*\)"$/\1/p' "$prefix/include/tether/version.h")"
if [ -z "$version" ]; then
  echo "install: no TETHER_VERSION in $prefix/include/tether/version.h" >&2
  exit 1
fi
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/cmake/tether.pc.in" \
  >"$prefix/lib/pkgconfig/tether.pc"
echo "install: tether in $prefix ($count headers); CMake: find_package(tether)" \
     "with CMAKE_PREFIX_PATH=$prefix; pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig"
