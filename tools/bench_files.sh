#!/usr/bin/env bash
# The file-target rows of docs/benchmarks.md ("File targets"): each row of
# `ferry bench --target-kind file` over local, tcp and shm (the remote ones
# against min(fio, the same transfers to memory)), a `sync` before each so
# that one row's dirty pages are not written back during the next.
# Usage: tools/bench_files.sh [path/to/ferry] [file] [seconds per row]
#   (defaults: build/tools/ferry, /tmp/ferry-bench.file, 4). Prints one line
#   a row; needs fio (Debian package) for the baselines.
set -euo pipefail
FERRY=${1:-build/tools/ferry}
FILE=${2:-/tmp/ferry-bench.file}
SECONDS_PER_ROW=${3:-4}
rows=(
  "--direct --random --operation read --block-size 4K --batch-size 64"
  "--direct --operation read --block-size 1M --batch-size 8"
  "--direct --operation write --block-size 1M --batch-size 8"
  "--direct --random --operation write --block-size 32K --batch-size 64"
  "--random --operation read --block-size 4K --batch-size 64"
  "--operation write --block-size 1M --batch-size 8"
)
summary='import json, sys
j = json.load(sys.stdin)
r = j["ratio"]
m = (j.get("memory") or {}).get("gbps")
fio = j.get("fio") or {}
print("ferry %.3f GB/s %.0f IOPS | fio %s GB/s %s IOPS | memory %s GB/s | ferry/fio %s | ferry/min %s"
      % (j["ferry"]["gbps"], j["ferry"]["iops"], fio.get("gbps"), fio.get("iops"), m, r["gbps"],
         r.get("gbps_vs_min_fio_memory")))'
for transport in local tcp shm; do
  for row in "${rows[@]}"; do
    sync
    # shellcheck disable=SC2086 # the row is a list of flags
    line=$("$FERRY" bench --target-kind file --file "$FILE" --transport "$transport" \
      --duration "$SECONDS_PER_ROW" --json $row | /usr/bin/python3 -c "$summary")
    echo "$transport | $row | $line"
  done
done
