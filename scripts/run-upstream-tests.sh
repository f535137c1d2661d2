#!/usr/bin/env bash
# Runs upstream's own Python tests and examples, unchanged, against Ferry's drop-ins.
#
#   scripts/run-upstream-tests.sh [BUILD_DIR]      (default: build; uses BUILD_DIR/python)
#
# NIXL 1.4.0 (8770b655) the way its CI (.gitlab/test_python.sh) runs them: pytest over
# test/python/test_*.py (conftest's --backend default, UCX), prep_xfer_perf.py list|array,
# partial_md_example.py (socket ports, then --etcd), query_mem_example.py, and the two-peer
# examples basic_two_peers.py / expanded_two_peers.py (target first, the initiator once the
# target logged "MD listener is listening on port N"; on torch < 2.0 with the one-line shim
# described at nixl_two_peers), then telemetry_reader.py over the expanded example's file.
# Mooncake 0.3.12.post1 (3b5a5941) the way scripts/run_tests.sh runs them:
# mooncake-wheel/tests/transfer_engine_target.py, then transfer_engine_initiator_test.py,
# with MC_FORCE_TCP=true, over each metadata kind: an HTTP server (here `ferry metadata-server`),
# etcd, and P2P handshakes (MC_METADATA_SERVER=P2PHANDSHAKE). Their
# `from mooncake.engine import TransferEngine` resolves to Ferry through a launcher that
# calls ferry.mooncake.install() and then runs the unchanged file.
#
# The files are extracted from the mirrors at the pinned commits into a temporary folder
# (nothing is committed). Environment: NIXL_MIRROR, MOONCAKE_MIRROR (git directories;
# an absent one is skipped), PYTHON (default /usr/bin/python3), UPSTREAM_TEST_TIMEOUT
# (seconds per process, default 300), UPSTREAM_TEST_LOGS (where the logs stay; default a new
# /tmp/ferry-upstream-logs.* folder). Every process runs under `timeout` and is killed
# at exit; every port is a free loopback port. Prints one line per test/example
# (PASS/FAIL/SKIP and why), then the counts; exits 1 if anything failed.
set -u

BUILD=$(cd "${1:-build}" 2>/dev/null && pwd) || { echo "no build directory '${1:-build}'"; exit 2; }
PYDIR=$BUILD/python
FERRY_BIN=$BUILD/tools/ferry
PY=${PYTHON:-/usr/bin/python3}
LIMIT=${UPSTREAM_TEST_TIMEOUT:-300}
NIXL_MIRROR=${NIXL_MIRROR:-/work/.mirror/ai-dynamo+nixl/repo}
NIXL_COMMIT=8770b655a6b17b5cdf7d2b56b6e0be5392496df5
MOONCAKE_MIRROR=${MOONCAKE_MIRROR:-/work/.mirror/kvcache-ai+Mooncake/repo}
MOONCAKE_COMMIT=3b5a594133958449a1feaf1c9e0fc1b553e34a28
[ -d "$PYDIR/ferry" ] || { echo "no Ferry package in $PYDIR (build first)"; exit 2; }

TMP=$(mktemp -d /tmp/ferry-upstream.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PASS=0 FAIL=0 SKIP=0
result() {  # STATUS NAME REASON
  printf '%-4s %s%s\n' "$1" "$2" "${3:+ -- $3}"
  case $1 in PASS) PASS=$((PASS + 1)) ;; FAIL) FAIL=$((FAIL + 1)) ;; SKIP) SKIP=$((SKIP + 1)) ;; esac
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# last_lines FILE: the end of a log, one line, for a FAIL reason.
last_lines() { tail -n 3 "$1" 2>/dev/null | tr '\n' ' ' | cut -c1-300; }

# wait_for FILE PATTERN PID SECONDS: until FILE has a line matching PATTERN (0), PID
# exited (1) or the time is up (2). Polls the log the process writes.
wait_for() {
  local end=$((SECONDS + $4))
  while [ $SECONDS -lt $end ]; do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { grep -q -- "$2" "$1" 2>/dev/null && return 0; return 1; }
    sleep 0.1
  done
  return 2
}

# run NAME LOG DIR CMD...: runs CMD in DIR under `timeout`; PASS when it exits 0.
run() {
  local name=$1 log=$2 dir=$3
  shift 3
  (cd "$dir" && exec timeout -k 5 "$LIMIT" "$@") >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && grep -q -E "$SELF_SKIP" "$log"; then
    result FAIL "$name" "exit 0 but it skipped itself: $(grep -m1 -E "$SELF_SKIP" "$log" | cut -c1-200)"
  elif [ $rc -eq 0 ]; then result PASS "$name"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then result FAIL "$name" "timed out after ${LIMIT}s; log $log"
  else result FAIL "$name" "exit $rc: $(last_lines "$log")"
  fi
}

# What an upstream example prints when it exits 0 without having run (query_mem_example.py
# does so when `import nixl._api` / `nixl.logging` fails).
SELF_SKIP='Skipping example|NIXL API missing'

# extract MIRROR COMMIT DEST PATHS...
extract() {
  local mirror=$1 commit=$2 dest=$3
  shift 3
  mkdir -p "$dest" && git -C "$mirror" archive "$commit" "$@" | tar -x -C "$dest"
}

export PYTHONPATH=$PYDIR
export PYTHONUNBUFFERED=1
LOGS=${UPSTREAM_TEST_LOGS:-$(mktemp -d /tmp/ferry-upstream-logs.XXXXXX)}  # kept
mkdir -p "$LOGS"
echo "Ferry: $PYDIR ($("$PY" -c 'import ferry; print(ferry.__file__)' 2>&1))"

# ---- NIXL -------------------------------------------------------------------------------
# The two-peer examples call torch.set_default_device("cpu"), which torch < 2.0 lacks (Debian
# 12 ships 1.13). "cpu" is the default device there already, so for those two runs only a
# sitecustomize adds the function for "cpu" (any other device raises): the examples run
# unchanged, and their PASS lines say that the shim was used.
TWO_PEER_PATH=$PYDIR
TWO_PEER_NOTE=""
if ! "$PY" -c 'import sys, torch; sys.exit(0 if hasattr(torch, "set_default_device") else 1)' \
    2>/dev/null; then
  mkdir -p "$TMP/torch-shim"
  cat >"$TMP/torch-shim/sitecustomize.py" <<'SHIM'
import torch

if not hasattr(torch, "set_default_device"):
    def set_default_device(device):
        if str(device) != "cpu":
            raise RuntimeError(f"torch {torch.__version__} cannot make {device} the default")

    torch.set_default_device = set_default_device
SHIM
  TWO_PEER_PATH=$TMP/torch-shim:$PYDIR
  TWO_PEER_NOTE=" (torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null): set_default_device('cpu') shimmed)"
fi

nixl_two_peers() {  # NAME SCRIPT [ENV=VAL ...]: target on port 0, then the initiator
  local name=$1$TWO_PEER_NOTE script=$2 dir=$TMP/nixl/examples/python
  shift 2
  local tlog
  tlog=$LOGS/${script%.py}.target.log
  (cd "$dir" && PYTHONPATH=$TWO_PEER_PATH NIXL_LOG_LEVEL=INFO exec timeout -k 5 "$LIMIT" \
    "$PY" "$script" --mode=target --ip=127.0.0.1 --port=0) >"$tlog" 2>&1 &
  local tpid=$!
  PIDS+=("$tpid")
  wait_for "$tlog" "MD listener is listening on port" "$tpid" 30
  case $? in
    1) result FAIL "$name" "target exited before logging 'MD listener is listening on port': $(last_lines "$tlog")"; return ;;
    2) kill "$tpid" 2>/dev/null
       result FAIL "$name" "target did not log 'MD listener is listening on port' within 30 s: $(last_lines "$tlog")"; return ;;
  esac
  local port
  port=$(awk '/MD listener is listening on port/ { print $NF; exit }' "$tlog")
  run "$name" "$LOGS/${script%.py}.initiator.log" "$dir" env PYTHONPATH="$TWO_PEER_PATH" "$@" "$PY" "$script" \
    --mode=initiator --ip=127.0.0.1 --port="$port"
  if ! timeout 30 tail --pid="$tpid" -f /dev/null; then
    kill "$tpid" 2>/dev/null
    result FAIL "$name (target)" "target still running 30 s after the initiator ended"
  else
    wait "$tpid"
    local trc=$?
    [ $trc -eq 0 ] || result FAIL "$name (target)" "target exit $trc: $(last_lines "$tlog")"
  fi
}

# NIXL's telemetry_reader.py over the file the expanded example's initiator wrote: upstream's
# CI starts it and interrupts it after 15 s; here it passes when it printed the events of that
# run (transfer bytes and times) before the interrupt.
telemetry_reader() {  # FILE
  local name="nixl telemetry_reader.py" log=$LOGS/telemetry_reader.log
  [ -f "$1" ] || { result FAIL "$name" "no telemetry file $1 (expanded_two_peers.py wrote none)"; return; }
  (cd "$TMP/nixl/examples/python" && exec timeout -k 5 "$LIMIT" "$PY" telemetry_reader.py \
    --telemetry_path "$1") >"$log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait_for "$log" "agent_xfer_time" "$pid" 15
  local found=$?
  kill -INT "$pid" 2>/dev/null
  wait "$pid"
  local rc=$?
  if [ $found -ne 0 ]; then
    result FAIL "$name" "no agent_xfer_time event read within 15 s: $(last_lines "$log")"
  elif ! grep -q "agent_tx_bytes" "$log"; then
    result FAIL "$name" "read transfer times but no agent_tx_bytes event"
  elif [ $rc -ne 0 ] && [ $rc -ne 130 ]; then
    result FAIL "$name" "exit $rc after the interrupt: $(last_lines "$log")"
  else
    result PASS "$name" "$(grep -c 'Event: ' "$log") events read"
  fi
}

start_etcd() {  # sets ETCD_ENDPOINT; returns 1 when no etcd came up
  local etcd client peer
  etcd=$(command -v etcd) || return 1
  client=$(free_port) peer=$(free_port)
  (exec timeout -k 5 "$LIMIT" "$etcd" --name t --data-dir "$TMP/etcd" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "t=http://127.0.0.1:$peer" --logger zap --log-level warn) >"$LOGS/etcd.log" 2>&1 &
  PIDS+=("$!")
  "$PY" - "$client" <<'EOF' || return 1
import socket, sys, time
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            if b'"health":"true"' in s.recv(4096):
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(1)
EOF
  ETCD_ENDPOINT=http://127.0.0.1:$client ETCD_PEER=http://127.0.0.1:$peer ETCD_PORT=$client
}

if [ ! -d "$NIXL_MIRROR" ]; then
  result SKIP "NIXL" "no mirror at $NIXL_MIRROR (set NIXL_MIRROR)"
elif ! extract "$NIXL_MIRROR" "$NIXL_COMMIT" "$TMP/nixl" test/python examples/python 2>"$LOGS/nixl-extract.log"; then
  result FAIL "NIXL" "cannot extract $NIXL_COMMIT from $NIXL_MIRROR: $(last_lines "$LOGS/nixl-extract.log")"
else
  # As upstream's CI (start_etcd_server "/nixl/python_ci"): one etcd for the whole NIXL part.
  if start_etcd; then
    export NIXL_ETCD_ENDPOINTS=$ETCD_ENDPOINT NIXL_ETCD_PEER_URLS=$ETCD_PEER
    export NIXL_ETCD_NAMESPACE=/nixl/python_ci/$ETCD_PORT
  else
    export NIXL_ETCD_ENDPOINTS=  # partial_md_example.py deletes it when not --etcd
    echo "     (no etcd came up: NIXL runs without NIXL_ETCD_ENDPOINTS; $(last_lines "$LOGS/etcd.log"))"
  fi
  for f in "$TMP"/nixl/test/python/test_*.py; do
    t=$(basename "$f" .py)
    run "nixl test/python/$t.py" "$LOGS/$t.log" "$TMP/nixl" \
      "$PY" -m pytest -q -p no:cacheprovider "test/python/$t.py"
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|^=+ .*(passed|failed|error)' "$LOGS/$t.log" | tail -n 1)
    [ -n "$summary" ] && echo "       pytest: $summary"
  done
  for mode in list array; do
    run "nixl test/python/prep_xfer_perf.py $mode" "$LOGS/prep_xfer_perf-$mode.log" "$TMP/nixl" \
      "$PY" test/python/prep_xfer_perf.py "$mode"
  done
  ex=$TMP/nixl/examples/python
  run "nixl partial_md_example.py (socket)" "$LOGS/partial_md.log" "$ex" \
    "$PY" partial_md_example.py --init-port "$(free_port)" --target-port "$(free_port)"
  if [ -n "$NIXL_ETCD_ENDPOINTS" ]; then
    run "nixl partial_md_example.py --etcd" "$LOGS/partial_md_etcd.log" "$ex" \
      "$PY" partial_md_example.py --etcd
  else
    result SKIP "nixl partial_md_example.py --etcd" "no etcd came up (etcd binary: $(command -v etcd || echo none))"
  fi
  run "nixl query_mem_example.py" "$LOGS/query_mem.log" "$ex" "$PY" query_mem_example.py
  nixl_two_peers "nixl basic_two_peers.py" basic_two_peers.py
  mkdir -p "$TMP/telemetry"
  nixl_two_peers "nixl expanded_two_peers.py" expanded_two_peers.py \
    NIXL_TELEMETRY_ENABLE=y NIXL_TELEMETRY_DIR="$TMP/telemetry"
  telemetry_reader "$TMP/telemetry/initiator"
fi

# ---- Mooncake ----------------------------------------------------------------------------
if [ ! -d "$MOONCAKE_MIRROR" ]; then
  result SKIP "Mooncake" "no mirror at $MOONCAKE_MIRROR (set MOONCAKE_MIRROR)"
elif ! extract "$MOONCAKE_MIRROR" "$MOONCAKE_COMMIT" "$TMP/mooncake" \
    mooncake-wheel/tests/transfer_engine_target.py \
    mooncake-wheel/tests/transfer_engine_initiator_test.py 2>"$LOGS/mooncake-extract.log"; then
  result FAIL "Mooncake" "cannot extract $MOONCAKE_COMMIT from $MOONCAKE_MIRROR: $(last_lines "$LOGS/mooncake-extract.log")"
elif [ ! -x "$FERRY_BIN" ]; then
  result SKIP "mooncake transfer_engine target + initiator" "no $FERRY_BIN for the HTTP metadata server"
else
  dir=$TMP/mooncake/mooncake-wheel/tests
  # Ours, not upstream's: makes `mooncake.engine` Ferry's, then runs the unchanged file.
  cat >"$TMP/with_ferry_mooncake.py" <<'EOF'
import runpy, sys
import ferry.mooncake
ferry.mooncake.install()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
EOF
  # mooncake_pair MODE: the target, then the initiator once the target is ready (as upstream's
  # scripts/run_tests.sh), with the metadata of MODE in MC_METADATA_SERVER.
  mooncake_pair() {
    local mode=$1 name="mooncake transfer_engine_initiator_test.py ($1 metadata)" tport
    tport=$(free_port)
    export MC_FORCE_TCP=true TARGET_SERVER_NAME=127.0.0.1:$tport
    export INITIATOR_SERVER_NAME=127.0.0.1:$(free_port)
    case $mode in
      http) export MC_METADATA_SERVER=http://$MADDR/metadata ;;
      etcd) export MC_METADATA_SERVER=127.0.0.1:$ETCD_PORT ;;
      p2p) export MC_METADATA_SERVER=P2PHANDSHAKE ;;
    esac
    local tlog=$LOGS/transfer_engine_target.$mode.log
    (cd "$dir" && MC_HANDSHAKE_PORT=$tport exec timeout -k 5 "$LIMIT" "$PY" \
      "$TMP/with_ferry_mooncake.py" transfer_engine_target.py) >"$tlog" 2>&1 &
    local tpid=$!
    PIDS+=("$tpid")
    if wait_for "$tlog" "Target server ready at" "$tpid" 60; then
      local ilog=$LOGS/transfer_engine_initiator_test.$mode.log
      run "$name" "$ilog" "$dir" "$PY" "$TMP/with_ferry_mooncake.py" \
        transfer_engine_initiator_test.py
      local summary
      summary=$(grep -E '^(Ran [0-9]+ tests|OK|FAILED)' "$ilog" | tr '\n' ' ')
      [ -n "$summary" ] && echo "       unittest: $summary"
    else
      result FAIL "$name" "target did not print 'Target server ready at': $(last_lines "$tlog")"
    fi
    kill "$tpid" 2>/dev/null  # the target serves until killed (`while True: pass`)
  }

  mlog=$LOGS/metadata-server.log
  (exec timeout -k 5 "$LIMIT" "$FERRY_BIN" metadata-server --port 0) >"$mlog" 2>&1 &
  PIDS+=("$!")
  if wait_for "$mlog" "metadata-server listening on" "$!" 30; then
    MADDR=$(awk '/metadata-server listening on/ { print $NF; exit }' "$mlog")
    mooncake_pair http
  else
    result FAIL "mooncake (http metadata)" "ferry metadata-server did not start: $(last_lines "$mlog")"
  fi
  if [ -n "${ETCD_PORT:-}" ]; then
    mooncake_pair etcd
  else
    result SKIP "mooncake (etcd metadata)" "no etcd came up"
  fi
  mooncake_pair p2p
fi

echo "upstream tests: $PASS passed, $FAIL failed, $SKIP skipped (logs in $LOGS)"
[ "$FAIL" -eq 0 ]
