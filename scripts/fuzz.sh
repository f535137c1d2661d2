#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang++, ASan + UBSan, the
# decoder sources only) in build-fuzz and runs each for a bounded time:
#   1. every input in tests/fuzz/regressions/<target>/ once (inputs that once
#      crashed a decoder; and tests/fuzz/pending/<target>/, reproducers of
#      bugs not fixed yet: reported, not counted),
#   2. libFuzzer for FERRY_FUZZ_SECONDS (default 20) per target, starting from
#      a temporary copy of tests/fuzz/corpus/<target>/ (the tree is not
#      modified; new inputs it finds are dropped).
# Prints per target the executions and the result, then one line
#   fuzz: N targets, M executions, K crashes
# and exits non-zero on any crash, timeout or out-of-memory, after printing
# the reproducer (kept under build-fuzz/crashes/<target>/) and the report.
#
# Environment: FERRY_FUZZ_SECONDS (per target; 0: corpus and regressions
# once, no fuzzing), FERRY_FUZZ_TARGETS (space-separated subset, e.g.
# "fuzz_frames fuzz_auth"), FERRY_FUZZ_BUILD_JOBS (default: nproc),
# FERRY_FUZZ_RSS_MB (default 2048), FERRY_FUZZ_TIMEOUT (seconds one input
# may take, default 10), FERRY_FUZZ_JOBS (targets run side by side, each on
# one core; default: nproc).
# Run one target longer by hand (docs/reliability.md, "Fuzzing"):
#   build-fuzz/tests/fuzz/fuzz_frames -max_total_time=3600 -rss_limit_mb=2048 \
#     -timeout=10 /tmp/corpus-frames tests/fuzz/corpus/fuzz_frames
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${FERRY_FUZZ_SECONDS:-20}"
rss_mb="${FERRY_FUZZ_RSS_MB:-2048}"
input_timeout="${FERRY_FUZZ_TIMEOUT:-10}"
jobs="${FERRY_FUZZ_BUILD_JOBS:-$(nproc)}"
fuzz_jobs="${FERRY_FUZZ_JOBS:-$(nproc)}"
for v in "$seconds" "$rss_mb" "$input_timeout" "$jobs" "$fuzz_jobs"; do
  if ! [[ "$v" =~ ^[0-9]+$ ]]; then
    echo "fuzz: FERRY_FUZZ_SECONDS, _RSS_MB, _TIMEOUT, _BUILD_JOBS and _JOBS must be whole numbers (got '$v')" >&2
    exit 2
  fi
done
if [ "$fuzz_jobs" -lt 1 ]; then
  echo "fuzz: FERRY_FUZZ_JOBS must be at least 1" >&2
  exit 2
fi

if ! command -v clang++ >/dev/null || ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  echo "fuzz: clang++, cmake or ninja missing; installing the dependencies"
  bash scripts/install-deps.sh || exit 1
fi

build=build-fuzz
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
start=$(date +%s)
if ! cmake -G Ninja -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_COMPILER=clang -DFERRY_FUZZ=ON -DFERRY_BUILD_PYTHON=OFF "${launcher[@]}" >"$build.configure.log" 2>&1; then
  echo "fuzz: configuring $build failed:"
  tail -n 20 "$build.configure.log"
  exit 1
fi
if ! cmake --build "$build" -j "$jobs" --target fuzz_all >"$build.log" 2>&1; then
  echo "fuzz: building the fuzz targets failed:"
  grep -E "error|FAILED|undefined" "$build.log" | head -n 20
  exit 1
fi
echo "fuzz: built the targets in $build ($(($(date +%s) - start)) s)"

all_targets=$(cat "$build/fuzz_targets.txt")
targets="${FERRY_FUZZ_TARGETS:-$all_targets}"
for t in $targets; do
  if ! grep -qx "$t" <<<"$all_targets"; then
    echo "fuzz: no target '$t' in this build (have: $(echo $all_targets))" >&2
    exit 2
  fi
done

work=$(mktemp -d /tmp/ferry-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The executions libFuzzer reports in log $1 (its final stats, else the last
# status line, else 0).
executions() {
  local n
  n=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$1" | tail -n 1)
  [ -n "$n" ] || n=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1)
  echo "${n:-0}"
}

# Prints the reproducers libFuzzer wrote for target $1 into $2, keeps them
# under build-fuzz/crashes/$1/, and the report from log $3.
report_crash() {
  local t="$1" dir="$2" log="$3" keep="$build/crashes/$1" f
  mkdir -p "$keep"
  echo "----- $t: sanitizer / libFuzzer report (last 40 lines of its log) -----"
  grep -v -E "^#[0-9]+|^INFO:|^\s*$" "$log" | tail -n 40
  for f in "$dir"/*; do
    [ -f "$f" ] || continue
    cp "$f" "$keep/"
    echo "----- reproducer: $keep/$(basename "$f") ($(stat -c %s "$f") bytes; first 256 as hex) -----"
    od -A x -t x1z -N 256 "$f"
    echo "rerun: $build/tests/fuzz/$t $keep/$(basename "$f")"
    echo "once the decoder is fixed, file it as tests/fuzz/regressions/$t/$(basename "$f") (wire_fuzz_replay runs it)"
  done
  echo "-----"
}

# fuzz_target T: the regressions, the pending reproducers and the timed run
# of target T. Its report goes to $work/$T.out and its counts to
# $work/$T.counts ("executions crashes pending"): targets run side by side.
fuzz_target() {
  local t="$1" bin="$build/tests/fuzz/$1" artifacts="$work/artifacts/$1" exec_n=0 crash_n=0 pending_n=0
  local opts regressions reg_result f limit t0 rc n found result corpus_files
  mkdir -p "$artifacts" "$work/corpus/$t"
  if [ -d "tests/fuzz/corpus/$t" ]; then cp -r "tests/fuzz/corpus/$t/." "$work/corpus/$t/"; fi
  opts=(-rss_limit_mb="$rss_mb" -timeout="$input_timeout" -artifact_prefix="$artifacts/" -print_final_stats=1)

  # 1. The regression inputs, once each.
  regressions=()
  if [ -d "tests/fuzz/regressions/$t" ]; then
    while IFS= read -r -d '' f; do regressions+=("$f"); done \
      < <(find "tests/fuzz/regressions/$t" -maxdepth 1 -type f ! -name '*.md' ! -name '.*' -print0 | sort -z)
  fi
  reg_result="none"
  if [ ${#regressions[@]} -gt 0 ]; then
    if "$bin" "${opts[@]}" "${regressions[@]}" >"$work/$t.regressions.log" 2>&1; then
      reg_result="${#regressions[@]} passed"
      exec_n=$((exec_n + ${#regressions[@]}))
    else
      reg_result="FAILED"
      echo "fuzz: $t: a regression input fails again:" \
        "$(sed -n 's/^Running: //p' "$work/$t.regressions.log" | tail -n 1)"
      report_crash "$t" "$artifacts" "$work/$t.regressions.log"
      crash_n=$((crash_n + 1))
      rm -f "$artifacts"/*
    fi
  fi

  # Known crashes waiting for a fix in src/ (tests/fuzz/pending/README.md):
  # reported, not counted as crashes.
  if [ -d "tests/fuzz/pending/$t" ]; then
    mkdir -p "$work/pending-artifacts/$t"
    while IFS= read -r -d '' f; do
      if "$bin" -rss_limit_mb="$rss_mb" -timeout="$input_timeout" -artifact_prefix="$work/pending-artifacts/$t/" \
          "$f" >"$work/$t.pending.log" 2>&1; then
        echo "fuzz: $t: $f no longer crashes: move it to tests/fuzz/regressions/$t/"
      else
        pending_n=$((pending_n + 1))
        echo "fuzz: $t: $f still crashes (known, fix pending: tests/fuzz/pending/README.md)"
      fi
    done < <(find "tests/fuzz/pending/$t" -maxdepth 1 -type f ! -name '*.md' ! -name '.*' -print0 | sort -z)
  fi

  # 2. Fuzzing from the seed corpus (0 s: the corpus once).
  if [ "$seconds" -eq 0 ]; then limit=(-runs=0); else limit=(-max_total_time="$seconds"); fi
  t0=$(date +%s)
  "$bin" "${opts[@]}" "${limit[@]}" "$work/corpus/$t" >"$work/$t.log" 2>&1
  rc=$?
  n=$(executions "$work/$t.log")
  exec_n=$((exec_n + n))
  found=$(find "$artifacts" -type f | wc -l)
  if [ "$rc" -eq 0 ] && [ "$found" -eq 0 ]; then
    result="ok"
  else
    result="CRASH (exit $rc)"
    crash_n=$((crash_n + 1))
  fi
  corpus_files=$(find "$work/corpus/$t" -type f | wc -l)
  printf 'fuzz: %-20s %10s executions in %3s s, corpus %4s inputs, regressions: %s, result: %s\n' \
    "$t" "$n" "$(($(date +%s) - t0))" "$corpus_files" "$reg_result" "$result"
  if [ "$result" != "ok" ]; then report_crash "$t" "$artifacts" "$work/$t.log"; fi
  echo "$exec_n $crash_n $pending_n" >"$work/$t.counts"
}

# The targets side by side, FERRY_FUZZ_JOBS at a time (default: one per
# core; each libFuzzer run is one process on one core, so each target still
# gets its full FERRY_FUZZ_SECONDS). Reports are printed in target order.
for t in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$fuzz_jobs" ]; do wait -n; done
  fuzz_target "$t" >"$work/$t.out" 2>&1 &
done
wait
total_exec=0
crashes=0
pending=0
count=0
for t in $targets; do
  count=$((count + 1))
  cat "$work/$t.out"
  if [ -s "$work/$t.counts" ]; then
    read -r e c p <"$work/$t.counts"
  else
    echo "fuzz: $t: the run ended without its counts"
    e=0 c=1 p=0
  fi
  total_exec=$((total_exec + e))
  crashes=$((crashes + c))
  pending=$((pending + p))
done

known=""
if [ "$pending" -gt 0 ]; then known=", $pending known crashes pending a fix in src/ (tests/fuzz/pending/)"; fi
echo "fuzz: $count targets, $total_exec executions, $crashes crashes (${seconds} s per target, $(($(date +%s) - start)) s in all)$known"
[ "$crashes" -eq 0 ]
