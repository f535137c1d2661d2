#!/usr/bin/env bash
# Packs what scripts/device-check.sh runs into one folder that the device
# tool can carry to a GPU machine, whose image has neither Debian's libraries
# nor a compiler for this project's dependencies:
#
#   scripts/device-kit.sh BUILD_DIR [PYTHON_BUILD_DIR] [KIT]   (KIT: .devkit)
#
#   KIT/build/tests/{gpu_test,ferry_test_peer}, KIT/build/tools/ferry  (stripped)
#   KIT/lib/       the shared libraries they need beyond the C and C++ runtimes
#   KIT/lib-maybe/ the common ones (OpenSSL, zlib, ...): device-check.sh uses
#                  each only where that machine lacks it, so that the machine's
#                  own Python and torch keep their newer copies
#   KIT/python/    the ferry and nixl packages of PYTHON_BUILD_DIR, whose
#                  extension must match the device's python3 (3.12 there)
#   KIT/upstream/nixl/  NIXL's own Python tests and examples at the commit
#                  scripts/run-upstream-tests.sh pins, unchanged, where the mirror
#                  is here ($NIXL_MIRROR; never committed: KIT is ignored)
#
# On the device: scripts/device-check.sh KIT/build (it finds ../lib itself).
# KIT must be a folder git ignores (echo /.devkit/ >> .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: device-kit.sh BUILD_DIR [PYTHON_BUILD_DIR] [KIT]}
pybuild=${2:-}
kit=${3:-.devkit}
rm -rf "$kit"
mkdir -p "$kit/build/tests" "$kit/build/tools" "$kit/lib" "$kit/lib-maybe"
bins=("$build/tests/gpu_test" "$build/tests/ferry_test_peer" "$build/tools/ferry")
install -m 755 -s "${bins[0]}" "${bins[1]}" "$kit/build/tests/"
install -m 755 -s "${bins[2]}" "$kit/build/tools/"
libs=$(ldd "${bins[@]}" | awk '$3 ~ /^\// {print $3}' | sort -u)
if [ -n "$pybuild" ]; then
  ext=$(ls "$pybuild"/python/ferry/_ferry.*.so)
  libs=$(printf '%s\n%s\n' "$libs" "$(ldd "$ext" | awk '$3 ~ /^\// {print $3}')" | sort -u)
  mkdir -p "$kit/python"
  cp -rL "$pybuild/python/ferry" "$pybuild/python/nixl" "$kit/python/"
  strip "$kit/python/ferry/"_ferry.*.so
fi
for lib in $libs; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libpthread.so.*|libdl.so.*|librt.so.*) ;;
    libssl.so.*|libcrypto.so.*|libz.so.*|libuuid.so.*|libatomic.so.*|libnuma.so.*)
      cp -L "$lib" "$kit/lib-maybe/" ;;
    *) cp -L "$lib" "$kit/lib/" ;;
  esac
done
nixl_mirror=${NIXL_MIRROR:-/work/.mirror/ai-dynamo+nixl/repo}
nixl_commit=$(sed -n 's/^NIXL_COMMIT=//p' scripts/run-upstream-tests.sh)
if [ -d "$nixl_mirror" ] && [ -n "$nixl_commit" ]; then
  mkdir -p "$kit/upstream/nixl"
  git -C "$nixl_mirror" archive "$nixl_commit" test/python examples/python | tar -x -C "$kit/upstream/nixl"
fi
du -sh "$kit"
