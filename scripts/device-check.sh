#!/usr/bin/env bash
# The GPU checks (docs/architecture.md, "Memory kinds: cuda"), on a machine
# with an NVIDIA GPU and its driver (libcuda.so.1), in at most 8 minutes:
# the two-process GPU cases of tests/integration/gpu_test.cc (GPU <-> GPU
# between processes through CUDA IPC, host <-> GPU, a notification right
# after GPU writes, a dead peer), run against the real driver instead of the
# tests' stand-in, every byte checked by copying it back through the driver.
#
#   scripts/device-check.sh [BUILD_DIR]
#
# Uses BUILD_DIR's binaries if they are there (built elsewhere and carried),
# else configures and builds just what it needs (Release, all cores). Logs go
# to $OUT (the device tool's output folder) or to BUILD_DIR/device-check.
# Not here yet: a GPU bench (the speed goals need `ferry bench` on GPU memory
# and a cuMemcpy baseline, neither built).
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-device}"
logs="${OUT:-$build/device-check}"
mkdir -p "$logs"
start=$(date +%s)
say() { echo "device-check: $*" | tee -a "$logs/summary.txt"; }

say "started $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi -L 2>&1 | tee -a "$logs/summary.txt" || say "nvidia-smi not found (the driver may still be there)"
if [ ! -x "$build/tests/integration_test" ] || [ ! -x "$build/tests/ferry_test_peer" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  say "building into $build"
  timeout 300 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >"$logs/configure.log" 2>&1 &&
    timeout 300 cmake --build "$build" -j"$(nproc)" --target integration_test ferry_test_peer ferry_cli \
      >"$logs/build.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    tail -40 "$logs/configure.log" "$logs/build.log" 2>/dev/null
    say "build failed (rc $rc)"
    exit 2
  fi
fi
"$build/tools/ferry" info >"$logs/ferry-info.txt" 2>&1
sed -n '/^cuda/,/memory kind/p' "$logs/ferry-info.txt" | tee -a "$logs/summary.txt"

export FERRY_TEST_CUDA_DRIVER=libcuda.so.1
timeout 240 "$build/tests/integration_test" --gtest_filter='GpuTest.*' >"$logs/gpu_test.log" 2>&1
rc=$?
grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|Failure|Which is|Expected|PASSED|FAILED' "$logs/gpu_test.log" | head -60 |
  tee -a "$logs/summary.txt"
say "gpu_test exit $rc after $(( $(date +%s) - start )) s"
exit $rc
