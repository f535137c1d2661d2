#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Ferry and runs every test:
#  1. the C++ suites under sanitizers — AddressSanitizer + UBSan over every
#     gtest binary, ThreadSanitizer over the engine's concurrency (core,
#     conformance); FERRY_SKIP_SANITIZERS=1 skips this pass (it is most of
#     the run time);
#  2. the libFuzzer targets, each for a bounded time (scripts/fuzz.sh;
#     FERRY_FUZZ_SECONDS per target, default 20);
#  3. every C++ test (ctest), then the Python package (pytest).
# Debug info is line tables only (-g1): enough for sanitizer reports and
# backtraces, and the builds take much less time than with full -g.
# Ends with ctest's and pytest's summary lines; exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh || exit 1

relflags="-O2 -g1 -DNDEBUG"
# The sanitizer builds at -O1 (what the sanitizers' own docs advise): an ASan
# test file compiles in 18 s instead of 29 s at -O2, and the reports keep
# their frames.
sanflags="-O1 -g1 -DNDEBUG"
san_rc=0
# What failed in the sanitizer and fuzz passes, printed again just before
# pytest: CI shows only the end of the output, and those passes run first.
recap=$(mktemp)
trap 'rm -f "$recap"' EXIT
if [ "${FERRY_SKIP_SANITIZERS:-0}" != "1" ]; then
  san_pass() {  # build dir, sanitizer, test binaries...
    local dir="$1" san="$2"
    shift 2
    echo "run-tests: sanitizer pass (${san}): $*"
    cmake -G Ninja -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_BUILD_PYTHON=OFF \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanflags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$sanflags" \
      -DFERRY_SANITIZE="$san" -DFERRY_WERROR=ON >/dev/null || return 1
    if ! cmake --build "$dir" -j "$(nproc)" --target "$@" ferry_test_peer >"$dir.log" 2>&1; then
      echo "run-tests: sanitizer build (${san}) failed:"
      grep -E "error|FAILED" "$dir.log" | head -n 20
      { echo "run-tests: sanitizer build (${san}) FAILED:"; grep -E "error|FAILED" "$dir.log" | head -n 20; } >>"$recap"
      return 1
    fi
    # Two at a time (the machines have two cores and most cases wait on
    # sockets and peers); the two longest binaries in two shards each,
    # longest first. Each one's output is printed when it ends.
    export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
    local logs="$dir/san-logs" t names=()
    rm -rf "$logs" && mkdir -p "$logs"
    san_one() {  # name, binary, shard index, shard count
      local name="$1" bin="$2"
      if [ "$(basename "$bin")" = wire_fuzz_replay ]; then
        "$bin" 300000 >"$logs/$name.log" 2>&1
      else
        GTEST_SHARD_INDEX="$3" GTEST_TOTAL_SHARDS="$4" "$bin" --gtest_brief=1 >"$logs/$name.log" 2>&1
      fi
      echo $? >"$logs/$name.rc"
    }
    local ordered=()
    for t in conformance_test integration_test; do
      for x in "$@"; do [ "$x" = "$t" ] && ordered+=("$t"); done
    done
    for t in "$@"; do
      [ "$t" = conformance_test ] || [ "$t" = integration_test ] || ordered+=("$t")
    done
    for t in "${ordered[@]}"; do
      local bin shards=1 k
      bin=$(find "$dir" -type f -name "$t" -perm -u+x | head -n 1)
      if [ "$t" = conformance_test ] || [ "$t" = integration_test ]; then shards=2; fi
      for ((k = 0; k < shards; k++)); do
        while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
        names+=("$t.$k")
        san_one "$t.$k" "$bin" "$k" "$shards" &
      done
    done
    wait
    local rc=0 n
    for n in "${names[@]}"; do
      echo "run-tests: ${san} ${n}:"
      cat "$logs/$n.log"
      if [ "$(cat "$logs/$n.rc" 2>/dev/null)" != 0 ]; then
        echo "run-tests: ${san} ${n} FAILED"
        rc=1
        {
          echo "run-tests: ${san} ${n} FAILED (exit $(cat "$logs/$n.rc" 2>/dev/null)); from its log:"
          grep -E -A6 "Failure$|leak of|^\[  FAILED  \]|SUMMARY: |WARNING: ThreadSanitizer|ERROR: [A-Za-z]+Sanitizer|runtime error|leaked in|Timeout|Aborted|terminate called" \
            "$logs/$n.log" | head -n 60
        } >>"$recap"
      fi
    done
    return $rc
  }
  san_pass build-asan address,undefined common_test wire_test core_test transport_test conformance_test \
    integration_test wire_fuzz_replay || san_rc=1
  san_pass build-tsan thread core_test common_test transport_test conformance_test || san_rc=1
  echo "run-tests: sanitizer passes exit ${san_rc} (0 = all passed), ${SECONDS} s since the start"
fi

fuzz_rc=0
fuzz_log=$(mktemp)
trap 'rm -f "$recap" "$fuzz_log"' EXIT
bash scripts/fuzz.sh 2>&1 | tee "$fuzz_log" || fuzz_rc=1
if [ "$fuzz_rc" -ne 0 ]; then
  { echo "run-tests: fuzz FAILED; its report:"; grep -E -A3 "CRASH|crashes|ERROR|rerun:|reproducer" "$fuzz_log" | head -n 40; } >>"$recap"
fi

cmake -G Ninja -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_WERROR=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$relflags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$relflags" \
  -DPython_EXECUTABLE=/usr/bin/python3 || exit 1
cmake --build build -j "$(nproc)" || exit 1
echo "run-tests: main build done, ${SECONDS} s since the start"

ctest_rc=0
# Two at a time: most cases wait on sockets and peers more than they
# compute; the soak and the netns suite run alone (RUN_SERIAL).
(cd build && ctest --output-on-failure --timeout 600 -j 2) || ctest_rc=$?

if [ -s "$recap" ]; then
  echo "run-tests: ctest done, ${SECONDS} s since the start; the sanitizer or fuzz pass failed (sanitizers exit ${san_rc}, fuzz exit ${fuzz_rc}):"
  cat "$recap"
fi

pytest_rc=0
if [ -d python/tests ]; then
  PYTHONPATH="$PWD/build/python" /usr/bin/python3 -m pytest -q python/tests || pytest_rc=$?
fi

# (No output after pytest's summary: the exit status says the rest.)
[ "$san_rc" -eq 0 ] && [ "$fuzz_rc" -eq 0 ] && [ "$ctest_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ]
