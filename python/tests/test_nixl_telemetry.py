"""nixl._telemetry: NIXL 1.4's telemetry switches, events and ring file.

The file checks decode the ring here (struct, from the layout NIXL documents)
and, where the NIXL mirror is present, with a copy of NIXL's own
examples/python/telemetry_reader.py run unchanged from a temporary folder.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal
import shutil
import struct
import subprocess
import sys
import threading
import time

import pytest

from nixl._telemetry import (EVENT_UNITS, STATUS_EVENTS, TELEMETRY_VERSION, AgentTelemetry,
                             EventType, TelemetrySettings, parse_bool, parse_enabled_metrics,
                             parse_unsigned)

NIXL_MIRROR = "/work/.mirror/ai-dynamo+nixl/repo"
NIXL_COMMIT = "8770b655"  # NIXL 1.4.0
READER_PATH = "examples/python/telemetry_reader.py"
QUIET = "10000"  # a run interval (ms) long enough that only flush()/close() export


# ---------------------------------------------------------------- helpers

def read_ring(path):
    """(header dict, unread events as (type, value)) decoded from the file."""
    with open(path, "rb") as f:
        data = f.read()
    write_pos, read_pos, version, expected, capacity, mask = struct.unpack_from("=QQiiQQ", data)
    header = dict(write_pos=write_pos, read_pos=read_pos, version=version,
                  expected_version=expected, capacity=capacity, mask=mask, size=len(data))
    events = []
    pos = read_pos
    while pos != write_pos:
        events.append(struct.unpack_from("=I4xQ", data, 40 + 16 * pos))
        pos = (pos + 1) & mask
    return header, events


def buffer_env(tmp_path, **extra):
    env = {"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_DIR": str(tmp_path),
           "NIXL_TELEMETRY_RUN_INTERVAL": QUIET}
    env.update(extra)
    return env


def upstream_reader(tmp_path):
    """NIXL's telemetry_reader.py copied unchanged into tmp_path, or skip."""
    if shutil.which("git") is None or not os.path.isdir(NIXL_MIRROR):
        pytest.skip(f"the NIXL mirror ({NIXL_MIRROR}) is absent: no upstream reader to run")
    shown = subprocess.run(["git", "-C", NIXL_MIRROR, "show", f"{NIXL_COMMIT}:{READER_PATH}"],
                           capture_output=True)
    if shown.returncode != 0:
        pytest.skip(f"{READER_PATH} at {NIXL_COMMIT} is not in {NIXL_MIRROR}: "
                    f"{shown.stderr.decode(errors='replace').strip()}")
    folder = tmp_path / "upstream"
    folder.mkdir()
    script = folder / "telemetry_reader.py"
    script.write_bytes(shown.stdout)
    return script


def wait_until(predicate, what, limit=60.0):
    """Poll predicate (the export thread's effect) until true; fail after limit s."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


def xfer(telemetry, op="WRITE", post_us=10, xfer_us=100, total_bytes=2000):
    telemetry.transfer_done(start_us=1, post_us=post_us, xfer_us=xfer_us,
                            total_bytes=total_bytes, desc_count=2, op=op, remote="peer")


T = EventType


# ---------------------------------------------------------------- parsing

@pytest.mark.parametrize("text", ["y", "YES", "On", "1", "true", "Enable"])
def test_bool_positive(text):
    assert parse_bool("V", text) is True


@pytest.mark.parametrize("text", ["n", "No", "OFF", "0", "False", "DISABLE"])
def test_bool_negative(text):
    assert parse_bool("V", text) is False


@pytest.mark.parametrize("text", ["", " y", "yes ", "2", "maybe", "t"])
def test_bool_refused(text):
    with pytest.raises(RuntimeError, match="V=.*not a boolean"):
        parse_bool("V", text)


@pytest.mark.parametrize("text,value", [("0", 0), ("4096", 4096), ("0x20", 32), ("0XfF", 255),
                                        ("007", 7), (str(2**64 - 1), 2**64 - 1)])
def test_unsigned_accepted(text, value):
    assert parse_unsigned("V", text) == value


@pytest.mark.parametrize("text,reason", [
    ("", "not an unsigned integer"), ("-1", "not an unsigned integer"),
    ("+1", "not an unsigned integer"), (" 1", "not an unsigned integer"),
    ("0x", "trailing garbage"), ("12ms", "trailing garbage"), ("1 ", "trailing garbage"),
    ("1.5", "trailing garbage"), (str(2**64), "out of range")])
def test_unsigned_refused(text, reason):
    with pytest.raises(RuntimeError, match=reason):
        parse_unsigned("V", text)


def test_enabled_metrics_globs(nixl_caplog):
    caplog = nixl_caplog
    assert parse_enabled_metrics(None) == frozenset(EventType)
    assert parse_enabled_metrics(" , ") == frozenset(EventType)
    assert parse_enabled_metrics("agent_tx_bytes") == {T.AGENT_TX_BYTES}
    assert parse_enabled_metrics("agent_err_*") == {e for e in EventType
                                                    if e.name.startswith("AGENT_ERR_")}
    assert parse_enabled_metrics(" agent_?x_bytes ,agent_xfer_*") == {
        T.AGENT_TX_BYTES, T.AGENT_RX_BYTES, T.AGENT_XFER_TIME, T.AGENT_XFER_POST_TIME}
    with caplog.at_level(logging.WARNING, logger="nixl"):
        assert parse_enabled_metrics("nope_*, also_missing") == frozenset()
    assert "'also_missing': no telemetry metric matches" in caplog.text
    assert "'nope_*': no telemetry metric matches" in caplog.text


def test_event_table_matches_nixl():
    assert TELEMETRY_VERSION == 4
    assert [e.value for e in EventType] == list(range(21))
    assert T.AGENT_XFER_POST_TIME.metric_name == "agent_xfer_post_time"
    assert EVENT_UNITS[T.AGENT_XFER_TIME] == "microseconds"
    assert EVENT_UNITS[T.AGENT_RX_BYTES] == "bytes"
    assert EVENT_UNITS[T.AGENT_ERR_CANCELED] == "count"
    assert STATUS_EVENTS["NIXL_ERR_REMOTE_DISCONNECT"] is T.AGENT_ERR_REMOTE_DISCONNECT
    assert STATUS_EVENTS["NIXL_ERR_NO_TELEMETRY"] is T.AGENT_ERR_NO_TELEMETRY
    assert len(STATUS_EVENTS) == 12


# ---------------------------------------------------------------- the switches

@pytest.mark.parametrize("env,capture,exporter", [
    ({}, False, None),
    ({}, True, "NOP"),
    ({"NIXL_TELEMETRY_ENABLE": "y"}, False, "NOP"),
    ({"NIXL_TELEMETRY_ENABLE": "no"}, True, None),  # "no" wins over capture_telemetry
    ({"NIXL_TELEMETRY_ENABLE": "no", "NIXL_TELEMETRY_DIR": "/nonexistent"}, True, None),
    ({"NIXL_TELEMETRY_ENABLE": "Yes", "NIXL_TELEMETRY_DIR": "D"}, False, "BUFFER"),
    ({"NIXL_TELEMETRY_DIR": "D"}, True, "BUFFER"),
    ({"NIXL_TELEMETRY_DIR": "D"}, False, None),  # a directory alone requests nothing
    ({"NIXL_TELEMETRY_ENABLE": "1", "NIXL_TELEMETRY_EXPORTER": "", "NIXL_TELEMETRY_DIR": "D"},
     False, "BUFFER"),
    ({"NIXL_TELEMETRY_ENABLE": "1", "NIXL_TELEMETRY_EXPORTER": "NOP",
      "NIXL_TELEMETRY_DIR": "D"}, False, "NOP"),
    # not requested: nothing else is read, bad values included
    ({"NIXL_TELEMETRY_BUFFER_SIZE": "0", "NIXL_TELEMETRY_EXPORTER": "x"}, False, None),
])
def test_settings_choose_exporter(tmp_path, env, capture, exporter):
    env = {k: (str(tmp_path) if v == "D" else v) for k, v in env.items()}
    settings = TelemetrySettings.from_environ("agent-a", capture, env)
    assert settings.exporter == exporter
    assert settings.enabled == (exporter is not None)
    assert settings.path == (str(tmp_path / "agent-a") if exporter == "BUFFER" else None)


def test_settings_defaults_and_values(tmp_path):
    s = TelemetrySettings.from_environ("a", True, {})
    assert (s.buffer_size, s.run_interval_ms, s.enabled_metrics) == (4096, 100, set(EventType))
    s = TelemetrySettings.from_environ("a", True, {
        "NIXL_TELEMETRY_DIR": str(tmp_path), "NIXL_TELEMETRY_BUFFER_SIZE": "0x20",
        "NIXL_TELEMETRY_RUN_INTERVAL": "5", "NIXL_TELEMETRY_ENABLED_METRICS": "agent_err_*"})
    assert (s.buffer_size, s.run_interval_ms) == (32, 5)
    assert T.AGENT_TX_BYTES not in s.enabled_metrics and T.AGENT_ERR_BACKEND in s.enabled_metrics
    # NOP keeps no ring, so any non-zero size is fine there
    assert TelemetrySettings.from_environ(
        "a", True, {"NIXL_TELEMETRY_BUFFER_SIZE": "100"}).buffer_size == 100
    # an empty directory name puts the file in the working directory, as NIXL's path join does
    assert TelemetrySettings.from_environ("a", True, {"NIXL_TELEMETRY_DIR": ""}).path == "a"


@pytest.mark.parametrize("env,error,match", [
    ({"NIXL_TELEMETRY_ENABLE": ""}, RuntimeError, "not a boolean"),
    ({"NIXL_TELEMETRY_ENABLE": "maybe"}, RuntimeError, "not a boolean"),
    ({"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_EXPORTER": "prometheus"}, RuntimeError,
     "Failed to load telemetry plugin: prometheus"),
    ({"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_EXPORTER": "buffer",
      "NIXL_TELEMETRY_DIR": "D"}, RuntimeError, "Failed to load telemetry plugin: buffer"),
    ({"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_EXPORTER": "BUFFER"}, RuntimeError,
     "Missing config entry 'NIXL_TELEMETRY_DIR'"),
    ({"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_BUFFER_SIZE": "0"}, ValueError,
     "cannot be 0"),
    ({"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_BUFFER_SIZE": "-5"}, RuntimeError,
     "NIXL_TELEMETRY_BUFFER_SIZE='-5' is not an unsigned integer"),
    ({"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_DIR": "D",
      "NIXL_TELEMETRY_BUFFER_SIZE": "100"}, ValueError, "power of 2"),
    ({"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_RUN_INTERVAL": "100ms"}, RuntimeError,
     "NIXL_TELEMETRY_RUN_INTERVAL='100ms': trailing garbage"),
])
def test_settings_refused(tmp_path, env, error, match):
    env = {k: (str(tmp_path) if v == "D" else v) for k, v in env.items()}
    with pytest.raises(error, match=match):
        AgentTelemetry.configure("agent-a", False, env)
    assert list(tmp_path.iterdir()) == []  # refused before any file is made


def test_empty_agent_name_refused():
    with pytest.raises(ValueError, match="non-empty agent name"):
        AgentTelemetry.configure("", True, {})


def test_missing_directory_names_the_path(tmp_path):
    missing = tmp_path / "not-made"
    with pytest.raises(RuntimeError, match=re.escape(str(missing / "a"))):
        AgentTelemetry.configure("a", True, {"NIXL_TELEMETRY_DIR": str(missing)})


def test_configure_reads_os_environ_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "on")
    monkeypatch.setenv("NIXL_TELEMETRY_DIR", str(tmp_path))
    t = AgentTelemetry.configure("from-env", False)
    try:
        assert t.enabled and t.exporter == "BUFFER" and os.path.exists(tmp_path / "from-env")
    finally:
        t.close()


# ---------------------------------------------------------------- no file

def test_disabled_writes_no_file_and_ignores_reports(tmp_path):
    env = {"NIXL_TELEMETRY_ENABLE": "no", "NIXL_TELEMETRY_DIR": str(tmp_path)}
    t = AgentTelemetry.configure("off", True, env)
    assert not t.enabled and t.exporter is None and t.path is None
    t.memory_registered(4096)
    xfer(t)
    t.error("NIXL_ERR_BACKEND")
    t.flush()
    t.close()
    assert t.totals() == {}
    assert list(tmp_path.iterdir()) == []


def test_nop_collects_in_process_and_writes_nothing(tmp_path):
    env = {"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_EXPORTER": "NOP",
           "NIXL_TELEMETRY_DIR": str(tmp_path)}
    t = AgentTelemetry.configure("nop", False, env)
    assert t.enabled and t.exporter == "NOP" and t.path is None
    xfer(t, op="READ", total_bytes=300)
    t.close()
    assert t.totals() == {"agent_rx_bytes": 300, "agent_rx_requests_num": 1,
                          "agent_xfer_time": 100, "agent_xfer_post_time": 10}
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the ring file

def test_file_holds_nixl_events_in_order(tmp_path):
    t = AgentTelemetry.configure("agent-1", False, buffer_env(tmp_path))
    path = tmp_path / "agent-1"
    assert t.path == str(path)
    header, events = read_ring(path)  # made at configure, empty until a flush
    assert header == dict(write_pos=0, read_pos=0, version=4, expected_version=4,
                          capacity=4096, mask=4095, size=40 + 16 * 4096)
    assert events == []

    t.memory_registered(1024)
    t.memory_deregistered(512)
    t.error("NIXL_ERR_BACKEND")
    xfer(t, op="WRITE", post_us=10, xfer_us=100, total_bytes=2000)
    xfer(t, op="READ", post_us=7, xfer_us=50, total_bytes=3000)
    t.transfer_posted(op="READ", total_bytes=3000, desc_count=1, remote="peer")  # no event
    t.close()
    t.close()  # idempotent
    t.memory_registered(1)  # ignored after close

    header, events = read_ring(path)
    assert events == [
        (T.AGENT_MEMORY_REGISTERED, 1024), (T.AGENT_MEMORY_DEREGISTERED, 512),
        (T.AGENT_ERR_BACKEND, 1),
        (T.AGENT_XFER_POST_TIME, 10), (T.AGENT_XFER_TIME, 100), (T.AGENT_TX_BYTES, 2000),
        (T.AGENT_TX_REQUESTS_NUM, 1),
        (T.AGENT_XFER_POST_TIME, 7), (T.AGENT_XFER_TIME, 50), (T.AGENT_RX_BYTES, 3000),
        (T.AGENT_RX_REQUESTS_NUM, 1)]
    assert (header["write_pos"], header["read_pos"], header["version"]) == (11, 0, 4)
    assert t.totals() == {
        "agent_tx_bytes": 2000, "agent_rx_bytes": 3000, "agent_tx_requests_num": 1,
        "agent_rx_requests_num": 1, "agent_memory_registered": 1024,
        "agent_memory_deregistered": 512, "agent_xfer_time": 150, "agent_xfer_post_time": 17,
        "agent_err_backend": 1}


def test_export_thread_flushes_on_its_interval(tmp_path):
    t = AgentTelemetry.configure("ticker", False,
                                 buffer_env(tmp_path, NIXL_TELEMETRY_RUN_INTERVAL="1"))
    try:
        t.memory_registered(4096)
        wait_until(lambda: read_ring(tmp_path / "ticker")[1] == [(T.AGENT_MEMORY_REGISTERED,
                                                                 4096)],
                   "the export thread to write the event")
    finally:
        t.close()


def test_allowlist_filters_at_the_source(tmp_path):
    env = buffer_env(tmp_path, NIXL_TELEMETRY_ENABLED_METRICS="agent_tx_bytes,agent_err_*")
    t = AgentTelemetry.configure("allow", False, env)
    xfer(t, op="WRITE", total_bytes=64)
    xfer(t, op="READ", total_bytes=32)
    t.memory_registered(4096)
    t.error("NIXL_ERR_CANCELED")
    t.close()
    assert read_ring(tmp_path / "allow")[1] == [(T.AGENT_TX_BYTES, 64), (T.AGENT_ERR_CANCELED, 1)]
    assert t.totals() == {"agent_tx_bytes": 64, "agent_err_canceled": 1}


def test_staging_drops_whole_batches_and_reports_them(tmp_path):
    # 16 staging slots: 14 events fit, a 4-event transfer batch does not (dropped
    # whole); the flush writes the 14 and one dropped-events event (15 = the
    # ring's usable slots).
    t = AgentTelemetry.configure("drops", False,
                                 buffer_env(tmp_path, NIXL_TELEMETRY_BUFFER_SIZE="16"))
    for i in range(14):
        t.memory_registered(i)
    xfer(t)
    t.close()
    header, events = read_ring(tmp_path / "drops")
    assert header["capacity"] == 16
    assert events == [(T.AGENT_MEMORY_REGISTERED, i) for i in range(14)] + [
        (T.AGENT_TELEMETRY_EVENTS_DROPPED, 4)]
    assert t.totals() == {"agent_memory_registered": sum(range(14)),
                          "agent_telemetry_events_dropped": 4}


def test_full_ring_loses_events_until_read(tmp_path):
    # Capacity 4 keeps 3 unread events; the writer never overtakes the reader.
    t = AgentTelemetry.configure("full", False,
                                 buffer_env(tmp_path, NIXL_TELEMETRY_BUFFER_SIZE="4"))
    for i in range(4):
        t.memory_registered(i + 1)
    t.flush()
    header, events = read_ring(tmp_path / "full")
    assert events == [(T.AGENT_MEMORY_REGISTERED, i + 1) for i in range(3)]
    # a reader consumes everything: its read_pos frees the slots
    with open(tmp_path / "full", "r+b") as f:
        f.seek(8)
        f.write(struct.pack("=Q", header["write_pos"]))
    t.memory_deregistered(9)
    t.close()
    assert read_ring(tmp_path / "full")[1] == [(T.AGENT_MEMORY_DEREGISTERED, 9)]


def test_reconfigure_resets_an_existing_file(tmp_path):
    t = AgentTelemetry.configure("again", False, buffer_env(tmp_path))
    t.memory_registered(1)
    t.close()
    t = AgentTelemetry.configure("again", False,
                                 buffer_env(tmp_path, NIXL_TELEMETRY_BUFFER_SIZE="8"))
    header, events = read_ring(tmp_path / "again")
    t.close()
    assert (header["capacity"], header["size"], events) == (8, 40 + 16 * 8, [])


def test_concurrent_reporters_lose_nothing(tmp_path):
    t = AgentTelemetry.configure("threads", False,
                                 buffer_env(tmp_path, NIXL_TELEMETRY_RUN_INTERVAL="1"))
    workers = [threading.Thread(target=lambda: [t.memory_registered(1) for _ in range(500)])
               for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    t.close()
    assert t.totals() == {"agent_memory_registered": 2000}
    assert read_ring(tmp_path / "threads")[1] == [(T.AGENT_MEMORY_REGISTERED, 1)] * 2000


def test_bad_reports_refused(tmp_path):
    t = AgentTelemetry.configure("bad", True, {})
    with pytest.raises(ValueError, match="not a NIXL error status: 'NIXL_SUCCESS'"):
        t.error("NIXL_SUCCESS")
    with pytest.raises(ValueError, match="'READ' or 'WRITE', not 'write'"):
        xfer(t, op="write")
    with pytest.raises(ValueError, match="total_bytes=-1"):
        xfer(t, total_bytes=-1)
    t.close()


def test_dropping_the_last_reference_flushes(tmp_path):
    t = AgentTelemetry.configure("gc", False, buffer_env(tmp_path))
    t.memory_registered(77)
    del t  # the export thread holds no reference to the handle
    import gc
    gc.collect()
    assert read_ring(tmp_path / "gc")[1] == [(T.AGENT_MEMORY_REGISTERED, 77)]


# ---------------------------------------------------------------- NIXL's own reader

def test_upstream_reader_classes_read_our_file(tmp_path):
    script = upstream_reader(tmp_path)
    spec = importlib.util.spec_from_file_location("nixl_upstream_telemetry_reader", script)
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)

    t = AgentTelemetry.configure("mod", False, buffer_env(tmp_path))
    xfer(t, op="READ", post_us=3, xfer_us=30, total_bytes=4096)
    t.error("NIXL_ERR_NOT_FOUND")
    t.close()

    ring = reader.SharedRingBuffer(str(tmp_path / "mod"))
    assert (ring.get_version(), ring.get_capacity(), ring.size()) == (4, 4096, 5)
    got = []
    while (event := ring.pop()) is not None:
        got.append((reader.get_telemetry_event_type_string(event.event_type), event.value))
    assert got == [("agent_xfer_post_time", 3), ("agent_xfer_time", 30),
                   ("agent_rx_bytes", 4096), ("agent_rx_requests_num", 1),
                   ("agent_err_not_found", 1)]
    assert ring.empty()


@pytest.mark.multiprocess
def test_upstream_reader_script_runs_on_our_file(tmp_path):
    script = upstream_reader(tmp_path)
    t = AgentTelemetry.configure("agent-x", False, buffer_env(tmp_path))
    t.memory_registered(1 << 20)
    xfer(t, op="WRITE", post_us=5, xfer_us=40, total_bytes=1024)
    t.error("NIXL_ERR_REMOTE_DISCONNECT")
    t.close()
    expected = [("agent_memory_registered", 1 << 20), ("agent_xfer_post_time", 5),
                ("agent_xfer_time", 40), ("agent_tx_bytes", 1024),
                ("agent_tx_requests_num", 1), ("agent_err_remote_disconnect", 1)]

    proc = subprocess.Popen([sys.executable, str(script), "--telemetry_path",
                             str(tmp_path / "agent-x")], cwd=script.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(120, proc.kill)  # bounds a reader that never prints
    watchdog.start()
    lines, names, values = [], [], []
    try:
        for line in proc.stdout:  # the reader loops until SIGINT; stop it once all are out
            lines.append(line)
            if m := re.search(r"Event: (\S+)$", line):
                names.append(m.group(1))
            if m := re.search(r"Value: (\d+)$", line):
                values.append(int(m.group(1)))
                if len(values) == len(expected):
                    proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(lines)
    assert rc == 0, output
    assert list(zip(names, values)) == expected, output
    assert f"Total events read: {len(expected)}" in output, output
    header, unread = read_ring(tmp_path / "agent-x")  # the reader moved read_pos
    assert (header["read_pos"], unread) == (len(expected), [])
