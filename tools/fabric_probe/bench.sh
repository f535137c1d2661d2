#!/bin/bash
# Throughput sweep (Q4). Before each point: waits until no compiler runs (pgrep -c cc1plus == 0) and the
# machine is otherwise idle (CPU busy < 25% over 1 s, from /proc/stat), up to 10 minutes, and records
# the busy figure it saw. Usage: bench.sh PROBE_BINARY OUTFILE [sweep|shmcfg|entries]
P=${1:-./probe}; OUT=${2:-bench.txt}; WHAT=${3:-sweep}
busy() { read -r _ a b c d e f g _ < /proc/stat; sleep 1; read -r _ A B C D E F G _ < /proc/stat
  local tot=$(( (A+B+C+D+E+F+G) - (a+b+c+d+e+f+g) )) idle=$(( (D+E) - (d+e) )); echo $(( 100 * (tot - idle) / tot )); }
# WAIT_S: how long one point may wait for a quiet machine (default 60 s); then it runs and says so.
wait_quiet() { local b=100; for i in $(seq 1 "${WAIT_S:-60}"); do
    if [ "$(pgrep -c cc1plus)" = 0 ]; then b=$(busy); [ "$b" -lt 25 ] && { echo "# busy ${b}%" >> "$OUT"; return; }; else sleep 1; fi
  done; echo "# WARN not quiet (busy ${b}%, cc1plus $(pgrep -c cc1plus))" >> "$OUT"; }
point() { wait_quiet; timeout 120 "$P" bench "$@" 2>/dev/null | grep BENCH >> "$OUT"; }
if [ "$WHAT" = sweep ]; then
  for prov in "tcp;ofi_rxm" shm; do
    for rw in write read; do
      for sz in 16384 32768 61440 65536 66560 131072 262144 1048576; do
        if [ "$prov" = shm ]; then fl=none; else fl=dc; fi
        [ $rw = read ] && fl=none
        point "$prov" $rw $sz 8,32 1 $fl 0.3 3
      done
    done
  done
elif [ "$WHAT" = shmcfg ]; then  # shm configurations of question 2, with and without CMA
  for cma in 0 1; do
    for fl in none dc ic; do
      for rw in write read; do
        [ $rw = read -a $fl != none ] && continue
        wait_quiet; FI_SHM_DISABLE_CMA=$cma timeout 120 "$P" bench shm $rw 32768,1048576 1,8,32 1 $fl 0.3 3 2>/dev/null |
          grep BENCH | sed "s/^/FI_SHM_DISABLE_CMA=$cma /" >> "$OUT"
      done
    done
  done
else  # entries of 2 KiB and 32 KiB gathered k per op (k local iovs x k remote rma_iovs)
  for prov in "tcp;ofi_rxm" shm; do
    for e in 2048 32768; do
      for k in 1 2 4; do
        if [ "$prov" = shm ]; then fl=none; else fl=dc; fi
        point "$prov" write $((e*k)) 4,8,16,32,64 ${k}x${k} $fl 0.3 3
      done
    done
  done
fi
