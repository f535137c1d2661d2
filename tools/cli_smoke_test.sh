#!/bin/sh
# Smoke tests of the `ferry` command: cli_smoke_test.sh PATH_TO_FERRY CASE
set -u
FERRY=$1
CASE=$2
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

fail() { echo "FAIL ($CASE): $*" >&2; exit 1; }

# The transport auto picks for the bench's target (another process here): shm
# where this machine lets a process read another's memory, else tcp.
same_host_transport() {
  "$FERRY" info --json | $PY -c "import json,sys; print('shm' if json.load(sys.stdin)['limits']['same_host_copy'] == 'ok' else 'tcp')"
}

# expect_status WANT CMD...: runs CMD, checks its exit status.
expect_status() {
  want=$1; shift
  "$@" >/tmp/ferry_smoke_out.$$ 2>/tmp/ferry_smoke_err.$$
  got=$?
  cat /tmp/ferry_smoke_out.$$ /tmp/ferry_smoke_err.$$
  rm -f /tmp/ferry_smoke_out.$$ /tmp/ferry_smoke_err.$$
  [ "$got" -eq "$want" ] || fail "'$*' exited $got, expected $want"
}

# wait_line PID FILE SED_SCRIPT: prints what `sed -n SED_SCRIPT FILE` prints once
# it prints something; gives up after 10 s, or sooner when process PID exits.
wait_line() {
  for _ in $(seq 100); do
    got=$(sed -n "$3" "$2")
    [ -n "$got" ] && { echo "$got"; return 0; }
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# stop PID: SIGTERM, then waits up to 10 s; sets rc to its exit status ("" if
# it is still running).
stop() {
  kill -TERM "$1"
  rc=""
  for _ in $(seq 100); do
    kill -0 "$1" 2>/dev/null || { wait "$1"; rc=$?; return 0; }
    sleep 0.1
  done
}

# start_metadata_server LOG ARGS...: a metadata-server on a free port, its output
# in LOG; sets pid and port (fails if it does not say where it listens).
start_metadata_server() {
  log=$1; shift
  "$FERRY" metadata-server --port 0 "$@" >"$log" 2>&1 &
  pid=$!
  port=$(wait_line $pid "$log" 's/^metadata-server listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p') ||
    { cat "$log"; kill -9 $pid 2>/dev/null; rm -f "$log"; fail "no 'listening on' line"; }
}

# check_json 'python expression on d' CMD...: CMD must print one JSON object.
check_json() {
  expr=$1; shift
  out=$("$@") || fail "'$*' exited $?"
  echo "$out"
  printf '%s' "$out" | $PY -c "
import json, sys
d = json.load(sys.stdin)
ok = $expr
sys.exit(0 if ok else 1)" || fail "JSON check failed: $expr"
}

case "$CASE" in
  info)
    expect_status 0 "$FERRY" info
    check_json "d['version'] != '' and 'tcp' in d['transports']" "$FERRY" info --json ;;
  info_cuda)
    # The cuda section: the driver found, or why not (none on a machine without a GPU).
    out=$("$FERRY" info) || fail "ferry info exited $?"
    printf '%s\n' "$out" | grep -q '^cuda (driver API)   ' || fail "no cuda section in: $out"
    printf '%s\n' "$out" | grep -q '^  memory kind cuda:N  ' || fail "no cuda memory kind line in: $out"
    check_json "d['cuda']['library'] == 'libcuda.so.1' and (d['cuda']['data_path'] == (d['cuda']['available'] and d['cuda']['why_no_data_path'] == '')) and ((d['cuda']['available'] and d['cuda']['why_unavailable'] == '' and d['cuda']['driver_version'] > 0) or (not d['cuda']['available'] and ('libcuda.so.1 not found' in d['cuda']['why_unavailable'] or 'cuInit failed' in d['cuda']['why_unavailable'])))" \
      "$FERRY" info --json
    if printf '%s\n' "$out" | grep -q '^cuda (driver API)   no driver: '; then
      printf '%s\n' "$out" | grep -q 'libcuda.so.1 not found' || fail "no driver, but the reason does not name libcuda.so.1"
    fi ;;
  info_environment)
    # The one environment reader: FERRY_* variables reach the effective settings.
    check_json "d['options']['spin_us'] == 77 and d['options']['wait_spin_us'] == 123 and d['options']['tcp_streams'] == 3 and d['options']['io_threads'] == 1 and d['options']['tcp_send_buffer'] == 0" \
      env FERRY_SPIN_US=77 FERRY_WAIT_SPIN_US=123 FERRY_TCP_STREAMS=3 FERRY_IO_THREADS=1 FERRY_TCP_SEND_BUFFER=0 "$FERRY" info --json
    check_json "d['options']['wait_spin_us'] == 200 and d['options']['spin_us'] == 50 and d['options']['tcp_send_buffer'] == 524288" \
      env -u FERRY_SPIN_US -u FERRY_WAIT_SPIN_US -u FERRY_TCP_SEND_BUFFER "$FERRY" info --json ;;
  help)
    expect_status 0 "$FERRY" --help
    expect_status 0 "$FERRY" bench --help
    expect_status 0 "$FERRY" info --help
    expect_status 0 "$FERRY" metadata-server --help ;;
  bad_flag)
    expect_status 2 "$FERRY" bench --no-such-flag
    expect_status 2 "$FERRY" no-such-command ;;
  bad_value)
    expect_status 2 "$FERRY" bench --block-size 12Q
    expect_status 2 "$FERRY" bench --operation sideways
    expect_status 2 "$FERRY" bench --workload kv:gpt-9
    expect_status 2 "$FERRY" bench --threads 0
    expect_status 2 "$FERRY" bench --local-memory huge
    expect_status 2 "$FERRY" bench --role target --local-memory shared ;;
  shm)
    # Forced shm, reads and writes in one batch, every byte checked.
    if [ "$(same_host_transport)" != shm ]; then
      echo "skipped: same-host copies refused here ($("$FERRY" info | grep same-host))"
      exit 0
    fi
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0 and d['transport'] == 'shm'" \
      "$FERRY" bench --transport shm --operation mixed --block-size 64K --batch-size 16 --duration 0.5 --json --verify --no-baseline ;;
  metadata_server)
    # The real server on a free port: PUT, GET, DELETE, then SIGTERM -> exit 0.
    expect_status 2 "$FERRY" metadata-server
    if ! "$FERRY" metadata-server --help | grep -q -- '--ttl-ms'; then fail "help names no --ttl-ms"; fi
    start_metadata_server /tmp/ferry_smoke_ms.$$ --ttl-ms 0
    url="http://127.0.0.1:$port/metadata?key=smoke/k1"
    $PY - "$url" <<'PYEOF' || { kill -9 $pid 2>/dev/null; rm -f "$log"; fail "HTTP checks failed"; }
import sys, urllib.request, urllib.error
url = sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy for 127.0.0.1
def call(method, data=None):
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.read(), r.headers.get("X-Ferry-TTL-Ms")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), None
assert call("GET")[0] == 404, "GET of a missing key"
s, _, ttl = call("PUT", b"value-1")
assert s == 200 and ttl == "0", (s, ttl)
assert call("GET")[:2] == (200, b"value-1")
assert call("POST", b"x")[0] == 405
assert call("DELETE")[0] == 200
assert call("GET")[0] == 404, "GET after DELETE"
assert call("DELETE")[0] == 404
print("metadata-server: PUT/GET/DELETE ok")
PYEOF
    stop $pid
    cat "$log"; rm -f "$log"
    if [ -z "$rc" ]; then kill -9 $pid 2>/dev/null; fail "server still running 10 s after SIGTERM"; fi
    [ "$rc" -eq 0 ] || fail "server exited $rc after SIGTERM" ;;
  bench_write_verify)
    # The default run: auto picks shm for the target process it starts (tcp where
    # this machine refuses same-host copies).
    want=$(same_host_transport)
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0 and d['bytes'] > 0 and d['transport'] == '$want'" \
      "$FERRY" bench --duration 0.5 --json --verify --no-baseline ;;
  bench_tcp_verify)
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0 and d['transport'] == 'tcp'" \
      "$FERRY" bench --transport tcp --operation mixed --workload kv:llama3-8b:tokens=256:page=1 --duration 0.5 --json --verify --no-baseline ;;
  bench_read_verify)
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0" \
      "$FERRY" bench --operation read --block-size 64K --batch-size 16 --threads 2 --duration 0.5 --json --verify --no-baseline
    # Into a shared (memfd) local buffer, as the Python package's managed buffers.
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0" \
      "$FERRY" bench --operation read --local-memory shared --duration 0.5 --json --verify --no-baseline ;;
  bench_kv_mixed_verify)
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0 and d['entries_per_batch'] == 64 * 256" \
      "$FERRY" bench --operation mixed --workload kv:llama3-8b:tokens=256:page=1 --duration 0.5 --json --verify --no-baseline
    # --prepared: the same requests as prepared transfers (one per opcode), and the plain batches.
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0 and d['prepared']['plain_mismatches'] == 0 and d['prepared']['transfers'] == 2 and d['prepared']['pairs'] == 64 * 256 and d['prepared']['million_rows']['rows'] == 1048576" \
      "$FERRY" bench --prepared --operation mixed --workload kv:llama3-8b:tokens=256:page=1 --duration 0.3 --json --verify --no-baseline ;;
  bench_sync_verify)
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0 and d['sync']" \
      "$FERRY" bench --sync --block-size 4K --total-bytes 4M --json --verify --no-baseline ;;
  bench_local_verify)
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0 and d['transport'] == 'local'" \
      "$FERRY" bench --transport local --duration 0.5 --json --verify --no-baseline ;;
  verify_catches_damage)
    # --verify must notice bytes that differ: 16 bytes of a write, 1 byte of a read.
    out=$("$FERRY" bench --duration 0.3 --json --verify --no-baseline --inject-mismatch)
    [ $? -eq 1 ] || fail "a run with mismatches must exit 1"
    printf '%s' "$out" | $PY -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['mismatches']==16 and d['mismatched_blocks']==1 else 1)" || fail "write damage not reported: $out"
    out=$("$FERRY" bench --operation read --duration 0.3 --json --verify --no-baseline --inject-mismatch)
    [ $? -eq 1 ] || fail "a run with mismatches must exit 1"
    printf '%s' "$out" | $PY -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['mismatches']==1 and d['mismatched_blocks']==1 else 1)" || fail "read damage not reported: $out" ;;
  bench_baseline_json)
    # The memcpy baseline walks at least 256 MiB on each side (4 MiB here).
    check_json "d['throughput_gbps'] > 0 and d['baseline']['socket_gbps'] > 0 and d['baseline']['socket_rtt_us'] > 0 and d['baseline']['memcpy_gbps'] > 0 and d['baseline']['scatter_gbps'] > 0 and d['latency_us']['p50'] > 0 and min(d['baseline']['memcpy_working_set_bytes']['source'], d['baseline']['memcpy_working_set_bytes']['destination']) >= 256 << 20 and d['baseline']['shm_pingpong_4k_us'] is None" \
      "$FERRY" bench --block-size 64K --batch-size 64 --duration 0.5 --json
    # --sync on shm: the shared-memory ping-pong ran, 8 B and 4 KiB, and the ratio is there.
    if [ "$(same_host_transport)" = shm ]; then
      check_json "d['sync'] and d['transport'] == 'shm' and d['baseline']['shm_pingpong_8_us']['samples'] > 0 and d['baseline']['shm_pingpong_4k_us']['p50'] > 0 and d['baseline']['ratios']['p50_vs_shm_pingpong_4k'] > 0" \
        "$FERRY" bench --sync --block-size 4K --duration 0.3 --json
    fi ;;
  bench_file_json)
    # This engine's file region against fio (both ran: their ops counted),
    # random 4 KiB reads and sequential writes; the bench's own file in a
    # temporary folder. --file without --target-kind file is refused.
    dir=$(mktemp -d)
    check_json "d['target_kind'] == 'file' and d['random'] and d['ferry']['iops'] > 0 and d['ferry']['direct_ops'] + d['ferry']['buffered_ops'] > 0 and (d['fio']['iops'] > 0 or d['fio']['error'] != '')" \
      "$FERRY" bench --target-kind file --file "$dir/f" --random --operation read --block-size 4K --batch-size 16 --duration 0.4 --json
    check_json "d['operation'] == 'write' and not d['random'] and d['ferry']['gbps'] > 0" \
      "$FERRY" bench --target-kind file --file "$dir/f" --operation write --block-size 64K --batch-size 4 --duration 0.4 --no-baseline --json
    expect_status 2 "$FERRY" bench --file "$dir/f"
    # --rounds: that many Ferry/fio alternations, each round's figures and ratio.
    check_json "d['rounds'] == 3 and len(d['per_round']) == 3 and all(r['ferry_gbps'] > 0 for r in d['per_round']) and (d['fio']['error'] != '' or all(r['ratio_gbps'] > 0 for r in d['per_round']))" \
      "$FERRY" bench --target-kind file --file "$dir/f" --operation read --block-size 64K --batch-size 4 --duration 0.6 --rounds 3 --json
    expect_status 2 "$FERRY" bench --target-kind file --file "$dir/f" --rounds 0
    # --fio-alongside: fio shares the disk with each Ferry phase; Ferry's
    # figure is what its ring took in fio's window (both moved bytes).
    check_json "d['fio_alongside'] and d['rounds'] == 2 and (d['fio']['error'] != '' or (d['fio']['gbps'] > 0 and all(r['ferry_gbps'] > 0 and r['fio_gbps'] > 0 for r in d['per_round'])))" \
      "$FERRY" bench --target-kind file --file "$dir/f" --operation read --block-size 64K --batch-size 4 --duration 0.6 --fio-alongside --json
    expect_status 2 "$FERRY" bench --target-kind file --file "$dir/f" --fio-alongside --no-baseline
    expect_status 2 "$FERRY" bench --rounds 3
    # KV pages (--workload): 64 layer buffers x 16 pages of 32 KiB as one batch,
    # written back against fio's random 32 KiB writes of the same file, then read.
    check_json "d['workload'] == 'kv:llama3-8b:tokens=256:page=16' and d['requests_per_batch'] == 1024 and d['block'] == 32768 and d['queue_depth'] == 64 and d['file_bytes'] == 32 << 20 and d['ferry']['iops'] > 0 and (d['fio']['iops'] > 0 or d['fio']['error'] != '')" \
      "$FERRY" bench --target-kind file --file "$dir/k" --workload kv:llama3-8b:tokens=256 --operation write --duration 0.4 --json
    check_json "d['operation'] == 'read' and d['requests_per_batch'] == 1024 and d['ferry']['gbps'] > 0" \
      "$FERRY" bench --target-kind file --file "$dir/k" --workload kv:llama3-8b:tokens=256 --operation read --duration 0.3 --no-baseline --json
    expect_status 2 "$FERRY" bench --target-kind file --file "$dir/k" --workload kv:llama3-8b --random
    rm -rf "$dir" ;;
  sweep)
    # Two points, no baselines: the CSV names the transport; the chart is drawn
    # when matplotlib is there (Debian's python3-matplotlib, installed by
    # scripts/install-deps.sh).
    dir=$(mktemp -d)
    expect_status 0 "$FERRY" bench --sweep --sweep-blocks 4K,64K --sweep-threads 1 --duration 0.2 --no-baseline --output "$dir/s"
    [ "$(wc -l < "$dir/s.csv")" -eq 3 ] || fail "expected a header and 2 rows in s.csv"
    head -1 "$dir/s.csv" | grep -q ',transport$' || fail "no transport column"
    want=$(same_host_transport)
    tail -1 "$dir/s.csv" | grep -q ",$want\$" || fail "the sweep did not run on $want: $(tail -1 "$dir/s.csv")"
    if $PY -c 'import matplotlib' 2>/dev/null; then
      [ -s "$dir/s.png" ] || fail "matplotlib is installed but no chart was drawn"
    fi
    rm -rf "$dir" ;;
  bench_metadata_http)
    # The bench's processes find each other by name through a real
    # metadata-server: the launcher (its target child publishes as
    # ferry-bench-target), then a target and an initiator started by hand.
    # Every wait is bounded; whatever is still running is killed on exit.
    expect_status 2 "$FERRY" bench --metadata bogus://x
    expect_status 2 "$FERRY" bench --name t1
    expect_status 2 "$FERRY" bench --metadata memory://one-process
    tlog=/tmp/ferry_smoke_mh_target.$$
    pid=""; tpid=""
    trap 'for p in $tpid $pid; do kill -9 $p 2>/dev/null; done; rm -f "$log" "$tlog"' EXIT
    start_metadata_server /tmp/ferry_smoke_mh.$$
    url="http://127.0.0.1:$port/metadata"
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0" \
      timeout 60 "$FERRY" bench --metadata "$url" --block-size 64K --batch-size 8 --duration 0.3 --json --verify --no-baseline
    # By hand: the target publishes as smoke-target; the initiator looks it up.
    "$FERRY" bench --role target --metadata "$url" --name smoke-target --buffer-size 16M >"$tlog" 2>&1 &
    tpid=$!
    control=$(wait_line $tpid "$tlog" 's/^control \(.*\)$/\1/p') ||
      { cat "$tlog"; fail "the target printed no control line"; }
    $PY - "$url?key=ferry/segments/smoke-target" <<'PYEOF' || fail "the target is not in the metadata service"
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy for 127.0.0.1
with opener.open(sys.argv[1], timeout=10) as r:
    assert r.status == 200 and len(r.read()) > 0
print("metadata-server holds ferry/segments/smoke-target")
PYEOF
    check_json "d['mismatches'] == 0 and d['verified_bytes'] > 0" \
      timeout 60 "$FERRY" bench --role initiator --metadata "$url" --target smoke-target --control "$control" \
        --operation read --block-size 64K --batch-size 8 --duration 0.3 --json --verify --no-baseline
    # Stop both; each must exit 0 within 10 s of SIGTERM.
    for p in $tpid $pid; do
      stop $p
      [ -n "$rc" ] || fail "process $p still running 10 s after SIGTERM"
      [ "$rc" -eq 0 ] || { cat "$tlog" "$log"; fail "process $p exited $rc after SIGTERM"; }
    done
    tpid=""; pid=""
    cat "$tlog" "$log" ;;
  bench_metadata_names)
    # With a metadata service a target started by hand says first the name it
    # published: an initiator finds it by that name; one given the target's
    # HOST:PORT (its peer_id line) finds it through the name its control port
    # reports or the default name, or else fails saying to pass that name.
    tlog=/tmp/ferry_smoke_mn_target.$$
    elog=/tmp/ferry_smoke_mn_err.$$
    pid=""; tpid=""
    trap 'for p in $tpid $pid; do kill -9 $p 2>/dev/null; done; rm -f "$log" "$tlog" "$elog"' EXIT
    start_metadata_server /tmp/ferry_smoke_mn.$$
    url="http://127.0.0.1:$port/metadata"
    # start_target [--name NAME]: sets tpid, first (its first line), peer, control.
    start_target() {
      "$FERRY" bench --role target --metadata "$url" "$@" --buffer-size 16M >"$tlog" 2>&1 &
      tpid=$!
      control=$(wait_line $tpid "$tlog" 's/^control \(.*\)$/\1/p') ||
        { cat "$tlog"; fail "the target printed no control line"; }
      first=$(head -n 1 "$tlog")
      peer=$(sed -n 's/^peer_id \(.*\)$/\1/p' "$tlog")
      [ -n "$peer" ] || { cat "$tlog"; fail "the target printed no peer_id line"; }
    }
    stop_target() {
      stop $tpid
      [ -n "$rc" ] || fail "the target is still running 10 s after SIGTERM"
      [ "$rc" -eq 0 ] || { cat "$tlog"; fail "the target exited $rc after SIGTERM"; }
      tpid=""
    }
    # initiator ARGS...: a short verified run (no --verify without --control);
    # stdout in $out, stderr in $elog, exit status in $irc.
    initiator() {
      out=$(timeout 60 "$FERRY" bench --role initiator --metadata "$url" "$@" \
        --block-size 64K --batch-size 8 --duration 0.2 --json --no-baseline 2>"$elog")
      irc=$?
      cat "$elog"
    }
    json_ok() {
      printf '%s' "$out" | $PY -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if $1 else 1)" ||
        fail "JSON check failed: $1: $out"
    }
    start_target --name smoke-names
    [ "$first" = "name smoke-names" ] || fail "the target's first line is '$first', not 'name smoke-names'"
    # (a) By the published name.
    initiator --target smoke-names --control "$control" --verify
    [ "$irc" -eq 0 ] || fail "the initiator given the published name exited $irc"
    json_ok "d['mismatches'] == 0 and d['verified_bytes'] > 0"
    # (b) By HOST:PORT with --control: the control port names the target.
    initiator --target "$peer" --control "$control" --verify
    [ "$irc" -eq 0 ] || fail "the initiator given $peer and --control exited $irc"
    json_ok "d['mismatches'] == 0 and d['verified_bytes'] > 0"
    grep -q "published as 'smoke-names'" "$elog" || fail "no note naming smoke-names"
    # (c) By HOST:PORT alone, a name other than the default: exit 1, saying
    # to pass the name the target printed.
    initiator --target "$peer"
    [ "$irc" -eq 1 ] || fail "the initiator given $peer alone exited $irc, expected 1"
    grep -q "pass --target NAME" "$elog" && grep -q "'name NAME'" "$elog" ||
      fail "the error does not say which name to use"
    stop_target
    # (d) By HOST:PORT alone, the default name: found.
    start_target
    [ "$first" = "name ferry-bench-target" ] || fail "the target's first line is '$first'"
    initiator --target "$peer"
    [ "$irc" -eq 0 ] || fail "the initiator given $peer (default name) exited $irc"
    json_ok "d['bytes'] > 0"
    grep -q "published as 'ferry-bench-target'" "$elog" || fail "no note naming ferry-bench-target"
    stop_target
    stop $pid
    [ -n "$rc" ] && [ "$rc" -eq 0 ] || { cat "$log"; fail "the metadata-server did not exit 0 after SIGTERM"; }
    pid="" ;;
  *)
    fail "unknown case" ;;
esac
echo "ok ($CASE)"
