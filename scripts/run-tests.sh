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
# Both tiers first check that every C/C++ file is formatted as .clang-format
# says (scripts/check-format.sh). The full tier, each suite once (ctest
# picks suites by label):
#  1. the release build (GCC -O2) and what only it runs: the soak, the
#     network-namespace fault tests (as root), the command line, the examples,
#     the install test,
#     the fuzz replay's long mutation run (beside step 2's build);
#  2. AddressSanitizer + UBSan (clang) over unit, conformance, security,
#     integration, metadata, gpu and the fuzz replay (beside step 3's build);
#  3. ThreadSanitizer (clang) over unit, conformance, security and gpu;
#  4. the libFuzzer targets, each for a bounded time (scripts/fuzz.sh;
#     FERRY_FUZZ_SECONDS per target, default 20), and beside them
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
      sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
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

# What pytest needs built: the module, the package sources, the fake CUDA driver.
python_targets=(ferry_python ferry_python_sources ferry_nixl_sources ferry_fake_cuda)
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

# Formatting first (seconds): an unformatted file fails the run, after the
# tests, with the list of files and the command that fixes them.
bash scripts/check-format.sh >format.log 2>&1 || fail "the format check (scripts/check-format.sh)" format.log
tail -n 1 format.log

if [ "$tier" = quick ]; then
  configure_release
  build build release ferry_tests_unit ferry_tests_conformance "${python_targets[@]}" ||
    { print_recap; exit 1; }
  phase "quick tier: release build done"
  # The fabric cases (libfabric's tcp provider) are the full tier's: they
  # take a third of the conformance time.
  run_ctest build "quick (release)" "unit|conformance" -E "/fabric_|Fabric(Rails|Tuning)"
  print_recap
  run_pytest -m "not multiprocess"
  exit $failed
fi

# The full tier. Some steps run in the background beside a build or another
# pass (the tests wait on sockets, timers and peers more than they compute,
# and like every suite they must pass on a loaded machine: docs/testing.md);
# each one's output is printed, whole, when it is waited for.
bg_dir=$(mktemp -d)
trap 'rm -rf "$recap" "$bg_dir"' EXIT
declare -A bg_pid=()
# bg_start NAME COMMAND...: runs COMMAND in the background.
bg_start() {
  local name="$1"
  shift
  (recap="$bg_dir/$name.recap" && "$@") >"$bg_dir/$name.log" 2>&1 &
  bg_pid[$name]=$!
}
# bg_finish NAME: waits for NAME, prints its output, keeps its failures.
bg_finish() {
  local name="$1"
  [ -n "${bg_pid[$name]:-}" ] || return 0
  wait "${bg_pid[$name]}"
  unset "bg_pid[$name]"
  cat "$bg_dir/$name.log"
  if [ -s "$bg_dir/$name.recap" ]; then
    cat "$bg_dir/$name.recap" >>"$recap"
    failed=1
  fi
}

# The sanitizer builds: each suite through ctest, a binary as a few gtest
# shards (FERRY_TEST_SHARDS), both with clang: under ASan+UBSan a test file
# compiles ~2.7x faster than with GCC, and the TSan build took 125 s with
# clang against 267 s with GCC (docs/testing.md).
# san_build DIR SANITIZERS LABELS [CMAKE ARGS...]
san_build() {
  local dir="$1" san="$2" labels="$3" t targets=()
  shift 3
  phase "sanitizer pass ($san): configuring and building $dir"
  if ! cmake -G Ninja -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_BUILD_PYTHON=OFF \
      -DFERRY_BUILD_TOOLS=OFF -DFERRY_BUILD_EXAMPLES=OFF \
      -DFERRY_TEST_SHARDS=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanflags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$sanflags" \
      -DFERRY_SANITIZE="$san" -DFERRY_WERROR=ON "${launcher[@]}" "$@" >"$dir.configure.log" 2>&1; then
    tail -n 30 "$dir.configure.log"
    fail "configuring $dir ($dir.configure.log)"
    return 1
  fi
  for t in ${labels//|/ }; do targets+=("ferry_tests_$t"); done
  build "$dir" "$san" "${targets[@]}" || return 1
  phase "sanitizer pass ($san): $dir built"
  touch "$dir.built"
}
asan_labels="unit|conformance|security|integration|metadata|gpu|fuzz"
tsan_labels="unit|conformance|security|gpu"
sanitizers=1
[ "${FERRY_SKIP_SANITIZERS:-0}" = "1" ] && sanitizers=0
rm -f build-asan.built build-tsan.built

# 1. The release build (the Python package, the command, and what only the
# release build runs); its tests beside the ASan build.
configure_release
# (install: tests/install/, the installed files, a consumer project and the .deb.)
if build build release ferry_tests_soak ferry_tests_netns ferry_tests_cli ferry_tests_example \
    ferry_tests_fuzz ferry_tests_install "${python_targets[@]}"; then
  phase "release build done"
  bg_start release run_ctest build release "soak|netns|cli|example|fuzz|install"
fi
if [ $sanitizers = 1 ]; then
  # 2. AddressSanitizer + UBSan; the TSan build beside its tests.
  # The test programs' own sources at -O0 (the library stays at -O1): they
  # compile 2.3-2.6x faster under ASan+UBSan (docs/testing.md, "Times").
  san_build build-asan address,undefined "$asan_labels" -DFERRY_TEST_COMPILE_OPTIONS=-O0
  bg_finish release
  bg_start tsan-build san_build build-tsan thread "$tsan_labels"
  [ -e build-asan.built ] && run_ctest build-asan address,undefined "$asan_labels"
  bg_finish tsan-build
  # 3. ThreadSanitizer.
  [ -e build-tsan.built ] && run_ctest build-tsan thread "$tsan_labels"
fi
bg_finish release

# 4. libFuzzer, with the Python tests beside it (printed last).
phase "fuzzing, and pytest beside it"
bg_start pytest run_pytest
fuzz_log="$bg_dir/fuzz.log"
if ! bash scripts/fuzz.sh 2>&1 | tee "$fuzz_log"; then
  grep -E -A3 "CRASH|crashes|ERROR|rerun:|reproducer" "$fuzz_log" | head -n 40 >"$fuzz_log.report"
  fail "fuzz (scripts/fuzz.sh)" "$fuzz_log.report"
fi

# 5. What failed before, then Python's output: CI shows the end of it.
print_recap
bg_finish pytest
# (No output after pytest's summary: the exit status says the rest.)
exit $failed
