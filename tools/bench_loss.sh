#!/usr/bin/env bash
# Throughput under packet loss: Ferry 1 MiB writes against iperf3 between two
# network namespaces joined by a veth pair, with N % of the packets entering
# and leaving the target's namespace dropped by nftables
# (`numgen random mod 100 < N drop`, input and output hooks).
#
# For each loss level and each repeat (interleaved), in this order:
#   iperf3, 1 stream, --duration seconds (a -> b, like Ferry's writes);
#   iperf3, -P S (S = Ferry's stream count, --streams), same duration;
#   ferry bench --role initiator (in a) against --role target (in b):
#     --transport tcp --operation write --block-size 1M, same duration.
# Prints one line per run (GB/s = 1e9 bytes/s, receiver goodput for iperf3;
# TCP retransmitted segments, tail-loss probes and retransmission timeouts
# of both namespaces over the run, from nstat), then the medians and the
# ratios ferry / iperf3.
#
# Usage: tools/bench_loss.sh [--ferry build/tools/ferry] [--duration 10]
#          [--loss "0 2"] [--repeat 1] [--streams 2] [--batch-size 32]
#          [-- extra ferry bench flags]
# Needs root, ip (iproute2), nft, iperf3. Waits (at most 10 minutes) until
# no compiler runs (pgrep cc1plus), so the figures are not taken on a busy
# machine (checked before every run; the 1-minute load average after each
# run is printed too). Removes its namespaces on exit (and stale ones of dead runs).
set -euo pipefail

FERRY=build/tools/ferry
DURATION=10
LOSSES="0 2"
REPEAT=1
STREAMS=2
BATCH=32
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ferry) FERRY=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --loss) LOSSES=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --streams) STREAMS=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "bench_loss.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "bench_loss.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (ip netns, nft)"
for t in ip nft iperf3 python3; do command -v "$t" >/dev/null || die "needs $t"; done
[ -x "$FERRY" ] || die "no ferry binary at $FERRY (build the ferry_cli target)"
FERRY=$(readlink -f "$FERRY")

PREFIX=ferrybench-
A=${PREFIX}$$-a
B=${PREFIX}$$-b
ADDR_A=10.78.1.1
ADDR_B=10.78.1.2
WORK=$(mktemp -d)
TARGET_PID=

cleanup() {
  [ -n "$TARGET_PID" ] && kill -INT "$TARGET_PID" 2>/dev/null || true
  for ns in "$A" "$B"; do
    if ip netns list | grep -q "^$ns\b"; then
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Namespaces of earlier runs whose script is gone.
for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX" || true); do
  owner=${ns#$PREFIX}; owner=${owner%%-*}
  if ! kill -0 "$owner" 2>/dev/null; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" && echo "removed stale namespace $ns"
  fi
done

# A quiet machine before every run: no compiler (waits at most 10 minutes).
wait_quiet() {
  for _ in $(seq 120); do
    [ "$(pgrep -c cc1plus || true)" -eq 0 ] && return 0
    sleep 5
  done
  die "compilers still running after 10 minutes; not measuring"
}
wait_quiet

ip netns add "$A"
ip netns add "$B"
ip -n "$A" link set lo up
ip -n "$B" link set lo up
ip -n "$A" link add to-b type veth peer name to-a netns "$B"
ip -n "$A" addr add "$ADDR_A/24" dev to-b
ip -n "$B" addr add "$ADDR_B/24" dev to-a
ip -n "$A" link set to-b up
ip -n "$B" link set to-a up

set_loss() {
  ip netns exec "$B" nft delete table inet ferry_loss 2>/dev/null || true
  [ "$1" -eq 0 ] && return 0
  ip netns exec "$B" nft "add table inet ferry_loss; \
    add chain inet ferry_loss in { type filter hook input priority 0; policy accept; }; \
    add chain inet ferry_loss out { type filter hook output priority 0; policy accept; }; \
    add rule inet ferry_loss in numgen random mod 100 < $1 drop; \
    add rule inet ferry_loss out numgen random mod 100 < $1 drop"
}

# "retrans probes timeouts" summed over both namespaces (absolute counters).
tcp_counters() {
  for ns in "$A" "$B"; do
    ip netns exec "$ns" nstat -asz TcpRetransSegs TcpExtTCPLossProbes TcpExtTCPTimeouts 2>/dev/null
  done | awk '$1=="TcpRetransSegs"{r+=$2} $1=="TcpExtTCPLossProbes"{p+=$2} $1=="TcpExtTCPTimeouts"{t+=$2}
              END {printf "%d %d %d\n", r, p, t}'
}
counters_since() {  # $1 = "r p t" before
  local now; now=$(tcp_counters)
  python3 -c 'import sys; a=list(map(int,sys.argv[1].split())); b=list(map(int,sys.argv[2].split()));
print("retrans %d probes %d rto %d" % tuple(y-x for x,y in zip(a,b)))' "$1" "$now"
}

# iperf3 a -> b; prints GB/s (receiver).
run_iperf() {  # $1 = parallel streams
  ip netns exec "$B" iperf3 -s -1 -B "$ADDR_B" -p 5299 >/dev/null 2>&1 &
  local server=$!
  for _ in $(seq 50); do
    ip netns exec "$B" ss -ltn 2>/dev/null | grep -q ":5299 " && break
    sleep 0.1
  done
  ip netns exec "$A" iperf3 -c "$ADDR_B" -B "$ADDR_A" -p 5299 -t "$DURATION" -P "$1" -J \
    > "$WORK/iperf.json" 2>&1 || true
  wait "$server" 2>/dev/null || true
  python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
if "error" in d: sys.exit("iperf3: " + d["error"])
print("%.4f" % (d["end"]["sum_received"]["bits_per_second"] / 8e9))' "$WORK/iperf.json"
}

# ferry bench initiator in a -> target in b; prints GB/s.
start_target() {
  ip netns exec "$B" "$FERRY" bench --role target --listen "$ADDR_B" --buffer-size 256M \
    > "$WORK/target.out" 2> "$WORK/target.err" &
  TARGET_PID=$!
  for _ in $(seq 100); do
    grep -q '^control' "$WORK/target.out" 2>/dev/null && break
    sleep 0.1
  done
  PEER=$(awk '/^peer_id/ {print $2}' "$WORK/target.out")
  [ -n "$PEER" ] || die "the target did not start: $(cat "$WORK/target.err")"
}
run_ferry() {
  ip netns exec "$A" "$FERRY" bench --role initiator --listen "$ADDR_A" --target "$PEER" \
    --transport tcp --operation write --block-size 1M --batch-size "$BATCH" --streams "$STREAMS" \
    --duration "$DURATION" --no-baseline --json "${EXTRA[@]}" > "$WORK/ferry.json" 2> "$WORK/ferry.err" \
    || die "ferry bench failed: $(tail -5 "$WORK/ferry.err")"
  python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["throughput_gbps"])' \
    "$WORK/ferry.json"
}

start_target
echo "bench_loss: $(basename "$FERRY") $("$FERRY" info 2>/dev/null | head -1 || true); $(nproc) cores;" \
     "duration ${DURATION}s; ferry: 1 MiB writes x $BATCH per batch, $STREAMS streams ${EXTRA[*]}"
echo "loss run what            GB/s   tcp counters (both namespaces)       load (1 min, after)"
declare -A RESULTS
for r in $(seq "$REPEAT"); do
  for loss in $LOSSES; do
    set_loss "$loss"
    for what in iperf3-1 "iperf3-P$STREAMS" ferry; do
      wait_quiet
      before=$(tcp_counters)
      case "$what" in
        iperf3-1) v=$(run_iperf 1) ;;
        iperf3-P*) v=$(run_iperf "$STREAMS") ;;
        ferry) v=$(run_ferry) ;;
      esac
      printf "%3s%% %3d %-14s %6s   %-36s %s\n" "$loss" "$r" "$what" "$v" "$(counters_since "$before")" \
        "$(cut -d' ' -f1 /proc/loadavg)"
      RESULTS[$loss,$what]="${RESULTS[$loss,$what]:-} $v"
    done
  done
done
set_loss 0

echo
echo "medians over $REPEAT run(s); ratio = ferry / iperf3"
echo "loss  iperf3-1  iperf3-P$STREAMS  ferry   ferry/iperf3-1  ferry/iperf3-P$STREAMS"
for loss in $LOSSES; do
  python3 -c 'import statistics as s, sys
m=[s.median(map(float, x.split())) for x in sys.argv[2:5]]
print("%3s%%  %8.4f  %9.4f  %6.4f  %14.2f  %15.2f" % (sys.argv[1], m[0], m[1], m[2], m[2]/m[0], m[2]/m[1]))' \
    "$loss" "${RESULTS[$loss,iperf3-1]}" "${RESULTS[$loss,iperf3-P$STREAMS]}" "${RESULTS[$loss,ferry]}"
done
