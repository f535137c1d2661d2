#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Ferry and runs its tests, in one
# of two tiers (docs/testing.md):
#
#   scripts/run-tests.sh           the full tier (the README's test command,
#                                  .ci/run): everything below
#   scripts/run-tests.sh --quick   the inner loop: the release build of the
#                                  unit and conformance suites over local, shm
#                                  and tcp, and the single-process pytest cases
#
# The full tier, each suite once (ctest picks suites by label):
#  1. the release build (GCC -O2) and what only it runs: the soak, the
#     network-namespace fault tests (as root), the command line, the examples,
#     the fuzz replay's long mutation run (while step 2 compiles);
#  2. AddressSanitizer + UBSan (clang) over unit, conformance, security,
#     integration, metadata, gpu and the fuzz replay;
#  3. ThreadSanitizer (GCC) over unit, conformance, security and gpu;
#  4. the libFuzzer targets, each for a bounded time (scripts/fuzz.sh;
#     FERRY_FUZZ_SECONDS per target, default 20);
#  5. the Python package (pytest, against Debian's /usr/bin/python3).
# FERRY_SKIP_SANITIZERS=1 skips 2 and 3; FERRY_FUZZ_SECONDS=0 runs the fuzz
# corpus once. FERRY_TEST_JOBS sets ctest's parallelism (default 2).
# ccache is used when present (scripts/install-deps.sh installs it), with the
# checkout as its base dir, so clones of the tree on one machine share it.
# Each pass prints ctest's summary; the run ends with a recap of whatever
# failed and pytest's summary line, and exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

tier=full
for arg in "$@"; do
  case "$arg" in
    --quick) tier=quick ;;
    --full) tier=full ;;
    -h | --help)
      sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "run-tests: unknown argument '$arg' (use --quick, --full or --help)" >&2
      exit 2
      ;;
  esac
done
jobs="${FERRY_TEST_JOBS:-2}"
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "run-tests: FERRY_TEST_JOBS must be a positive whole number (got '$jobs')" >&2
  exit 2
fi

bash scripts/install-deps.sh || exit 1

# Debug info is line tables only (-g1): enough for sanitizer reports and
# backtraces, and the builds take much less time than with full -g.
relflags="-O2 -g1 -DNDEBUG"
# The sanitizer builds at -O1 (what the sanitizers' own docs advise).
sanflags="-O1 -g1 -DNDEBUG"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
fi

recap=$(mktemp)
trap 'rm -f "$recap"' EXIT
failed=0
phase() { echo "run-tests: $*, ${SECONDS} s since the start"; }
# fail WHAT [DETAILS_FILE]: remembers a failure for the recap.
fail() {
  failed=1
  echo "run-tests: $1 FAILED" >>"$recap"
  if [ -n "${2:-}" ] && [ -s "$2" ]; then sed 's/^/    /' "$2" >>"$recap"; fi
}

# build DIR WHAT TARGETS...: builds, or prints the errors and records them.
build() {
  local dir="$1" what="$2" log
  shift 2
  log="$dir.build.log"
  if cmake --build "$dir" -j "$(nproc)" --target "$@" >"$log" 2>&1; then return 0; fi
  echo "run-tests: the $what build failed:"
  grep -E "error|FAILED|undefined reference" "$log" | head -n 30 | tee "$log.errors"
  fail "the $what build (full log: $log)" "$log.errors"
  return 1
}

# run_ctest DIR WHAT LABELS [ctest args...]: the tests carrying one of LABELS
# (a |-list), two at a time; records the failed ones.
run_ctest() {
  local dir="$1" what="$2" labels="$3"
  shift 3
  phase "$what: ctest -L '^($labels)\$'"
  if (cd "$dir" && ctest --output-on-failure --timeout 600 -j "$jobs" -L "^($labels)\$" "$@"); then
    return 0
  fi
  fail "$what tests (rerun one: cd $dir && ctest --output-on-failure -R NAME)" \
    "$dir/Testing/Temporary/LastTestsFailed.log"
}

configure_release() {
  cmake -G Ninja -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_WERROR=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$relflags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$relflags" \
    -DPython_EXECUTABLE=/usr/bin/python3 "${launcher[@]}" >build.configure.log 2>&1 && return 0
  tail -n 30 build.configure.log
  echo "run-tests: configuring build/ failed"
  exit 1
}

run_pytest() {  # pytest args...
  [ -d python/tests ] || return 0
  phase "pytest $*"
  PYTHONPATH="$PWD/build/python" /usr/bin/python3 -m pytest -q python/tests "$@" || fail "pytest"
}

print_recap() {
  if [ -s "$recap" ]; then
    phase "done; what failed"
    cat "$recap"
  else
    phase "done; everything before pytest passed"
  fi
}

if [ "$tier" = quick ]; then
  configure_release
  build build release ferry_tests_unit ferry_tests_conformance ferry_python ferry_python_sources \
    ferry_nixl_sources || { print_recap; exit 1; }
  phase "quick tier: release build done"
  # The fabric cases (libfabric's tcp provider) are the full tier's: they
  # take a third of the conformance time.
  run_ctest build "quick (release)" "unit|conformance" -E "/fabric_|Fabric(Rails|Tuning)"
  print_recap
  run_pytest -m "not multiprocess"
  exit $failed
fi

# 1. The release build: the Python package, the command, and what only the
# release build runs. Its tests run while the AddressSanitizer build
# compiles (they wait on sockets, timers and peers more than they compute;
# like every suite they must pass on a loaded machine: docs/testing.md).
configure_release
release_logs=$(mktemp -d)
trap 'rm -rf "$recap" "$release_logs"' EXIT
release_pid=""
if build build release ferry_tests_soak ferry_tests_netns ferry_tests_cli ferry_tests_example \
    ferry_tests_fuzz ferry_python ferry_python_sources ferry_nixl_sources ferry_fake_cuda; then
  phase "release build done"
  (recap="$release_logs/recap" run_ctest build release "soak|netns|cli|example|fuzz") \
    >"$release_logs/ctest.log" 2>&1 &
  release_pid=$!
fi
# Waits for the release tests and prints what they printed.
finish_release_tests() {
  [ -n "$release_pid" ] || return 0
  wait "$release_pid"
  release_pid=""
  cat "$release_logs/ctest.log"
  if [ -s "$release_logs/recap" ]; then
    cat "$release_logs/recap" >>"$recap"
    failed=1
  fi
}

# 2-3. The sanitizer builds, each suite run through ctest, a binary as a few
# gtest shards (FERRY_TEST_SHARDS). AddressSanitizer + UBSan with clang (a
# test file compiles ~2.7x faster than with GCC there); ThreadSanitizer with
# GCC (as fast as clang there, and it compiles the test files with GCC's
# warnings too).
# san_pass DIR SANITIZERS COMPILER LABELS [ACTION_BETWEEN_BUILD_AND_TESTS]
san_pass() {
  local dir="$1" san="$2" cc="$3" labels="$4" between="${5:-}" cxx t targets=()
  if [ "$cc" = clang ]; then cxx=clang++; else cxx=g++; fi
  phase "sanitizer pass ($san, $cc): configuring and building $dir"
  if ! cmake -G Ninja -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_BUILD_PYTHON=OFF \
      -DFERRY_BUILD_TOOLS=OFF -DFERRY_BUILD_EXAMPLES=OFF -DFERRY_TEST_CLI="$PWD/build/tools/ferry" \
      -DFERRY_TEST_SHARDS=ON -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanflags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$sanflags" \
      -DFERRY_SANITIZE="$san" -DFERRY_WERROR=ON "${launcher[@]}" >"$dir.configure.log" 2>&1; then
    tail -n 30 "$dir.configure.log"
    fail "configuring $dir ($dir.configure.log)"
    [ -z "$between" ] || $between
    return
  fi
  for t in ${labels//|/ }; do targets+=("ferry_tests_$t"); done
  build "$dir" "$san" "${targets[@]}"
  local built=$?
  [ -z "$between" ] || $between
  [ $built -eq 0 ] || return
  run_ctest "$dir" "$san" "$labels"
}
if [ "${FERRY_SKIP_SANITIZERS:-0}" != "1" ]; then
  san_pass build-asan address,undefined clang "unit|conformance|security|integration|metadata|gpu|fuzz" \
    finish_release_tests
  san_pass build-tsan thread gcc "unit|conformance|security|gpu"
fi
finish_release_tests

# 4. libFuzzer.
phase "fuzzing"
fuzz_log=$(mktemp)
trap 'rm -rf "$recap" "$release_logs" "$fuzz_log"' EXIT
if ! bash scripts/fuzz.sh 2>&1 | tee "$fuzz_log"; then
  grep -E -A3 "CRASH|crashes|ERROR|rerun:|reproducer" "$fuzz_log" | head -n 40 >"$fuzz_log.report"
  fail "fuzz (scripts/fuzz.sh)" "$fuzz_log.report"
  rm -f "$fuzz_log.report"
fi

# 5. What failed before, then Python: CI shows the end of the output.
print_recap
run_pytest
# (No output after pytest's summary: the exit status says the rest.)
exit $failed
