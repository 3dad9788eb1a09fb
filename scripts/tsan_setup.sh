#!/usr/bin/env bash
# Prepares `bazel test --config=tsan`: builds Debian's own Abseil source with
# ThreadSanitizer (Debian ships it uninstrumented, and TSan cannot see an
# uninstrumented absl::Mutex) into the user's cache, tries the same for
# TensorPipe, and writes .tsan.bazelrc (not tracked) so the tsan config links
# and runs against them. Idempotent: each library is built once per Debian
# version (a stamp file in its prefix).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

cache="${XDG_CACHE_HOME:-$HOME/.cache}/tether-tsan"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
work=""
tp_work=""
trap 'rm -rf "$work" "$tp_work"' EXIT

# Source packages come from the same Debian archive as the binaries.
ensure_deb_src() {
  if ! apt-get source --print-uris abseil >/dev/null 2>&1; then
    $sudo tee /etc/apt/sources.list.d/tether-src.sources >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    $sudo apt-get update -q
  fi
}

# ---------------------------------------------------------------- Abseil
prefix="$cache/absl"
version="$(dpkg-query -W -f='${Version}' libabsl-dev)"
stamp="$prefix/.built-$version"

if [ ! -f "$stamp" ]; then
  ensure_deb_src
  command -v cmake >/dev/null || $sudo apt-get install -y -q cmake
  work="$(mktemp -d)"
  (cd "$work" && apt-get source -q --download-only "abseil=$version" &&
     dpkg-source -x ./*.dsc src >/dev/null)
  # Debian's patches (absl/base/options.h pinned to absl's own types) are
  # applied by dpkg-source, so the ABI matches /usr/include/absl.
  cmake -S "$work/src" -B "$work/build" -DCMAKE_CXX_STANDARD=17 \
    -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_INSTALL_PREFIX="$prefix"
  make -C "$work/build" -j"$(nproc)" install
  touch "$stamp"
fi

# ------------------------------------------------------------ TensorPipe
# The same version as libtensorpipe-dev, built by Debian's own debian/rules
# (its patches, its CMake options, the system libuv) with -fsanitize=thread
# appended through dpkg-buildflags, so only the instrumentation differs.
tp_prefix="$cache/tensorpipe"
tp_version="$(dpkg-query -W -f='${Version}' libtensorpipe-dev)"
tp_stamp="$tp_prefix/.built-$tp_version"

if [ ! -f "$tp_stamp" ]; then
  ensure_deb_src
  tp_work="$(mktemp -d)"
  if (cd "$tp_work" &&
        apt-get source -q --download-only "tensorpipe=$tp_version") \
      >"$tp_work/fetch.log" 2>&1; then
    (cd "$tp_work" && dpkg-source -x ./*.dsc src >/dev/null)
    $sudo apt-get build-dep -y -q "tensorpipe=$tp_version"
    (cd "$tp_work/src" &&
       DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" \
       DEB_CFLAGS_APPEND=-fsanitize=thread \
       DEB_CXXFLAGS_APPEND=-fsanitize=thread \
       DEB_LDFLAGS_APPEND=-fsanitize=thread \
       debian/rules build)
    mkdir -p "$tp_prefix/lib"
    find "$tp_work/src" -name 'libtensorpipe.so*' \
      -exec cp -a {} "$tp_prefix/lib/" \;
    [ -e "$tp_prefix/lib/libtensorpipe.so.0" ] || {
      echo "tsan_setup: the TensorPipe build made no libtensorpipe.so.0" >&2
      exit 1
    }
    touch "$tp_stamp"
  else
    # Seen on this project's machines: the archive mirror serves the .dsc
    # but answers 404 for the tarballs. TSan then runs against Debian's
    # uninstrumented libtensorpipe, and testing/tsan.supp says what that
    # costs.
    echo "tsan_setup: WARNING: cannot fetch Debian's tensorpipe source" \
      "$tp_version, so TensorPipe stays uninstrumented:" >&2
    grep -E '^E:' "$tp_work/fetch.log" >&2 || cat "$tp_work/fetch.log" >&2
  fi
fi

{
  echo "# Written by scripts/tsan_setup.sh: libraries built with ThreadSanitizer."
  echo "build:tsan --linkopt=-L$prefix/lib --linkopt=-Wl,-rpath,$prefix/lib"
  if [ -f "$tp_stamp" ]; then
    echo "build:tsan --linkopt=-L$tp_prefix/lib --linkopt=-Wl,-rpath,$tp_prefix/lib"
  fi
} > .tsan.bazelrc
if [ -f "$tp_stamp" ]; then
  echo "tsan_setup: Abseil and TensorPipe with TSan in $cache"
else
  echo "tsan_setup: Abseil with TSan in $prefix (TensorPipe uninstrumented)"
fi
echo "tsan_setup: run: bazel test --config=tsan //..."
