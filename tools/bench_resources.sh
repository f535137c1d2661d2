#!/usr/bin/env bash
# Measures the two resource rows of the goals table (docs/benchmarks.md):
#  1. idle CPU: a target engine serving nothing, and one right after a
#     benchmark run with its connections still open, sampled over 10 s;
#  2. sockets over 100,000 synchronous 4 KiB transfers in a row: open file
#     descriptors of the initiator and TIME_WAIT sockets on the machine,
#     before and after.
# Usage: tools/bench_resources.sh [path/to/ferry] [transport]   (transport:
# auto (default: shm, the target is on this host), tcp, shm)
set -euo pipefail
FERRY=${1:-build/tools/ferry}
TRANSPORT=${2:-auto}
TICKS=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
time_wait() { ss -tan state time-wait | tail -n +2 | wc -l; }

# 1. Idle target.
out=$(mktemp)
"$FERRY" bench --role target --buffer-size 64M > "$out" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 50); do grep -q '^peer_id' "$out" && break; sleep 0.1; done
peer=$(awk '/^peer_id/ {print $2}' "$out")
sleep 1
t0=$(cpu_ticks $pid); sleep 10; t1=$(cpu_ticks $pid)
echo "idle target, nothing connected: $(( (t1 - t0) * 1000 / TICKS )) ms CPU in 10 s"

# 2. 100,000 transfers in a row against it (block 4K, sync), counting sockets.
tw0=$(time_wait)
"$FERRY" bench --role initiator --target "$peer" --transport "$TRANSPORT" --sync --block-size 4K \
  --total-bytes $((100000 * 4096)) --no-baseline --json > /tmp/ferry-100k.json &
ipid=$!
sleep 1
fds_early=$(ls /proc/$ipid/fd 2>/dev/null | wc -l || echo 0)
wait $ipid
tw1=$(time_wait)
echo "100,000 sync 4 KiB writes: initiator fds after 1 s: ${fds_early}; TIME_WAIT before ${tw0}, after ${tw1}"
/usr/bin/python3 -c 'import json,sys; d=json.load(open("/tmp/ferry-100k.json")); print("  transport", d["transport"], "bytes", d["bytes"], "p50 us", d["latency_us"]["p50"])'

# 3. The target idle again, its peer gone, after serving.
sleep 1
t0=$(cpu_ticks $pid); sleep 10; t1=$(cpu_ticks $pid)
echo "idle target after serving: $(( (t1 - t0) * 1000 / TICKS )) ms CPU in 10 s"
