#!/usr/bin/env bash
# The GPU checks (docs/architecture.md, "Memory kinds: cuda"), on a machine
# with an NVIDIA GPU and its driver (libcuda.so.1), in at most 8 minutes:
# the two-process GPU cases of tests/integration/gpu_test.cc (GPU <-> GPU
# between processes through CUDA IPC, host <-> GPU, a notification right
# after GPU writes, a dead peer) and the staged cases of
# tests/transport/gpu_staging_test.cc (GPU memory over tcp, shm and fabric),
# both in the gpu_test binary,
# run against the real driver instead of the tests' stand-in, every byte
# checked by copying it back through the driver; then a short bench
# (GpuBench.DISABLED_Figures: cuMemcpy device to device as the baseline of
# GPU -> GPU through cuda_ipc, Ferry tcp from host memory as the baseline of
# tcp from GPU memory).
#
# Then the Python drop-ins on the GPU (tools/device_python_check.py: the
# Mooncake drop-in's GPU transfers and *_on_cuda methods, NIXL's VRAM), where
# python3 has torch and the ferry package is found (BUILD_DIR/../python, as
# scripts/device-kit.sh packs it, or PYTHONPATH).
#
#   scripts/device-check.sh [BUILD_DIR]
#
# Uses BUILD_DIR's binaries if they are there (built elsewhere and carried:
# scripts/device-kit.sh, whose BUILD_DIR/../lib holds the libraries they need),
# else configures and builds just what it needs (Release, all cores). Logs go
# to $OUT (the device tool's output folder) or to BUILD_DIR/device-check.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build="${1:-build-device}"
logs="${OUT:-$build/device-check}"
mkdir -p "$logs"
start=$(date +%s)
say() { echo "device-check: $*" | tee -a "$logs/summary.txt"; }

say "started $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi -L 2>&1 | tee -a "$logs/summary.txt" || say "nvidia-smi not found (the driver may still be there)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
  tee -a "$logs/summary.txt"
if [ -d "$build/../lib" ]; then  # a kit (scripts/device-kit.sh)
  kit=$(cd "$build/.." && pwd)
  for lib in "$kit"/lib-maybe/*; do  # only those this machine lacks
    [ -e "$lib" ] || continue
    ldconfig -p | grep -q "^[[:space:]]*$(basename "$lib") " || cp "$lib" "$kit/lib/"
  done
  export LD_LIBRARY_PATH="$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -d "$kit/python" ] && export PYTHONPATH="$kit/python${PYTHONPATH:+:$PYTHONPATH}"
  ldd "$build/tests/gpu_test" | grep 'not found' | tee -a "$logs/summary.txt"
fi
if [ ! -x "$build/tests/gpu_test" ] || [ ! -x "$build/tests/ferry_test_peer" ] ||
   [ ! -x "$build/tools/ferry" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  say "building into $build"
  timeout 300 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >"$logs/configure.log" 2>&1 &&
    timeout 300 cmake --build "$build" -j"$(nproc)" --target gpu_test ferry_test_peer ferry_cli \
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

# (A dry run elsewhere may name the fake: FERRY_TEST_CUDA_DRIVER=path/libferry_fake_cuda.so.)
export FERRY_TEST_CUDA_DRIVER="${FERRY_TEST_CUDA_DRIVER:-libcuda.so.1}"
rc=0
run() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local r=$?
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|Failure|Which is|Expected|PASSED|FAILED|gpu-bench' "$logs/$name.log" |
    head -60 | tee -a "$logs/summary.txt"
  say "$name exit $r after $(( $(date +%s) - start )) s"
  [ $r -eq 0 ] || rc=$r
}
run gpu_test 150 "$build/tests/gpu_test" --gtest_filter='GpuTest.*'
run gpu_staging 120 "$build/tests/gpu_test" --gtest_filter='*GpuStaging*'
run gpu_bench 150 "$build/tests/gpu_test" --gtest_filter='GpuBench.*' --gtest_also_run_disabled_tests
if python3 -c 'import torch, ferry, nixl; assert torch.cuda.is_available()' >"$logs/python-probe.log" 2>&1; then
  PYTHONUNBUFFERED=1 timeout 120 python3 tools/device_python_check.py >"$logs/python.log" 2>&1
  r=$?
  grep -E '^device-python|Error|error' "$logs/python.log" | head -40 | tee -a "$logs/summary.txt"
  say "python exit $r after $(( $(date +%s) - start )) s"
  [ $r -eq 0 ] || rc=$r
  # NIXL's own tests and its two-peer examples on GPU tensors (--use_cuda), unchanged,
  # where the kit carries them (scripts/device-kit.sh).
  up=${kit:-}/upstream/nixl
  if [ -n "${kit:-}" ] && [ -d "$up/test/python" ]; then
    (cd "$up" && PYTHONUNBUFFERED=1 timeout 150 python3 -m pytest -q -p no:cacheprovider test/python) \
      >"$logs/nixl-pytest.log" 2>&1
    r=$?
    grep -E 'passed|failed|error' "$logs/nixl-pytest.log" | tail -3 | tee -a "$logs/summary.txt"
    say "nixl test/python exit $r after $(( $(date +%s) - start )) s"
    [ $r -eq 0 ] || rc=$r
    for ex in basic_two_peers expanded_two_peers; do
      (cd "$up/examples/python" && NIXL_LOG_LEVEL=INFO timeout 60 python3 "$ex.py" --mode=target \
        --ip=127.0.0.1 --port=0 --use_cuda True) >"$logs/$ex.target.log" 2>&1 &
      tpid=$!
      port=
      for _ in $(seq 300); do
        port=$(awk '/MD listener is listening on port/ { print $NF; exit }' "$logs/$ex.target.log")
        [ -n "$port" ] && break
        kill -0 "$tpid" 2>/dev/null || break
        sleep 0.1
      done
      r=1
      if [ -n "$port" ]; then
        (cd "$up/examples/python" && timeout 60 python3 "$ex.py" --mode=initiator --ip=127.0.0.1 \
          --port="$port" --use_cuda True) >"$logs/$ex.initiator.log" 2>&1
        r=$?
        wait "$tpid" || r=$?
      else
        kill "$tpid" 2>/dev/null
      fi
      tail -3 "$logs/$ex.initiator.log" "$logs/$ex.target.log" 2>/dev/null | tee -a "$logs/summary.txt"
      say "nixl $ex.py --use_cuda True exit $r"
      [ $r -eq 0 ] || rc=$r
    done
  fi
else
  tail -5 "$logs/python-probe.log" | tee -a "$logs/summary.txt"
  say "python checks skipped: python3 lacks torch with a GPU, or the ferry package"
fi
exit $rc
