#!/usr/bin/env bash
# Prepares `bazel test --config=tsan`: builds Debian's own Abseil source with
# ThreadSanitizer (Debian ships it uninstrumented, and TSan cannot see an
# uninstrumented absl::Mutex) into the user's cache, and writes .tsan.bazelrc
# (not tracked) so the tsan config links and runs against it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

prefix="${XDG_CACHE_HOME:-$HOME/.cache}/tether-tsan/absl"
version="$(dpkg-query -W -f='${Version}' libabsl-dev)"
stamp="$prefix/.built-$version"

if [ ! -f "$stamp" ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  if ! apt-get source --print-uris abseil >/dev/null 2>&1; then
    # Source packages come from the same Debian archive as the binaries.
    $sudo tee /etc/apt/sources.list.d/tether-src.sources >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    $sudo apt-get update -q
  fi
  command -v cmake >/dev/null || $sudo apt-get install -y -q cmake
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
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

cat > .tsan.bazelrc <<RC
# Written by scripts/tsan_setup.sh: Abseil built with ThreadSanitizer.
build:tsan --linkopt=-L$prefix/lib --linkopt=-Wl,-rpath,$prefix/lib
RC
echo "tsan_setup: Abseil with TSan in $prefix; run: bazel test --config=tsan //..."
