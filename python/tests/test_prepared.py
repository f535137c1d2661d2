"""ferry.Engine's prepared transfers (prepare / make_transfer / Transfer),
agent metadata, cancellation and metrics, against a target process."""

from __future__ import annotations

import hashlib
import re
import threading
import time
import urllib.request

import numpy as np
import pytest

import ferry
from peer import pattern

SIZE = 4 << 20
BLOCK = 4096


def sha(data) -> str:
    return hashlib.sha256(np.asarray(data).tobytes()).hexdigest()


@pytest.fixture
def target(spawn):
    t = spawn("native", str(SIZE))
    t.request("fill", seed=1)
    return t


@pytest.fixture
def engine():
    with ferry.Engine() as e:
        yield e


def blocks(addr, n, block=BLOCK, columns=3):
    """(n, columns) uint64 rows of consecutive blocks at addr."""
    rows = np.zeros((n, columns), np.uint64)
    rows[:, 0] = addr + np.arange(n, dtype=np.uint64) * block
    rows[:, 1] = block
    return rows


def remote_block(seed, b, block=BLOCK):
    return pattern(seed, SIZE)[b * block:(b + 1) * block]


# ---- Lists -------------------------------------------------------------------------
def test_prepare_local_and_remote_lists_in_every_shape(engine, target):
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    n = SIZE // BLOCK
    for columns in (2, 3):
        lst = engine.prepare(blocks(local.ctypes.data, n, columns=columns))
        assert len(lst) == n and lst and lst.segment is None
        lst.release()
        lst.release()  # idempotent
        assert lst.released
    rows = blocks(target.hello["addr"], n).astype(np.int64)  # signed ints are fine too
    remote = engine.prepare(rows, seg)
    assert len(remote) == n and remote.segment is seg
    # strided rows: (addr, len, dev, stride, count) and (addr, len, stride, count)
    five = np.array([[target.hello["addr"], BLOCK, 0, 2 * BLOCK, n // 2]], np.uint64)
    assert len(engine.prepare(five, seg)) == n // 2
    four = np.array([[local.ctypes.data, BLOCK, 2 * BLOCK, n // 2]], np.uint64)
    assert len(engine.prepare(four)) == n // 2
    # a list of tuples, and a peer id instead of a Segment
    tuples = engine.prepare([(target.hello["addr"], 16, 0), (target.hello["addr"] + 64, 16, 0)],
                            target.hello["peer_id"])
    assert len(tuples) == 2 and tuples.segment is seg
    # a non-contiguous view is read through its strides
    wide = np.zeros((4, 6), np.uint64)
    wide[:, 0] = local.ctypes.data + np.arange(4) * BLOCK
    wide[:, 2] = BLOCK
    assert len(engine.prepare(wide[:, ::2])) == 4  # columns addr, len, dev


def test_prepare_refuses_bad_rows(engine, target):
    local = np.zeros(1 << 16, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    addr = target.hello["addr"]
    with pytest.raises(ferry.NotFound):
        engine.prepare([(addr + SIZE, 16, 0)], seg)  # past the peer's region
    with pytest.raises(ferry.NotFound):
        engine.prepare([(addr, 16, 0), (addr + SIZE - 8, 16, 0)], seg)  # straddles its end
    with pytest.raises(ferry.NotFound):
        engine.prepare(np.array([[addr, BLOCK, 0, BLOCK, SIZE // BLOCK + 1]], np.uint64), seg)
    with pytest.raises(ferry.NotFound):
        engine.prepare([(local.ctypes.data + local.nbytes, 16, 0)])  # not registered here
    for bad in (np.zeros((2, 6), np.uint64), np.zeros((2, 3), np.float64), np.zeros(6, np.uint64),
                [(1,)], [(1, 2, "x")], "junk", 42):
        with pytest.raises(ferry.InvalidArgument):
            engine.prepare(bad)
    with pytest.raises(ferry.InvalidArgument, match="row 1, column 1"):
        engine.prepare(np.array([[local.ctypes.data, 16, 0], [local.ctypes.data, -1, 0]], np.int64))
    with pytest.raises(ferry.InvalidArgument):
        engine.prepare([(local.ctypes.data, 0, 0)])  # zero length
    with pytest.raises(ferry.InvalidArgument):
        engine.prepare(np.zeros((0, 3), np.uint64))  # empty


def test_a_million_rows_prepare_from_numpy(engine):
    n = 1 << 20
    local = np.zeros(n * 16, np.uint8)
    engine.register(local)
    rows = blocks(local.ctypes.data, n, block=16)
    start = time.perf_counter()
    lst = engine.prepare(rows)
    took = time.perf_counter() - start
    assert len(lst) == n
    print(f"prepare of {n} rows: {took * 1e3:.1f} ms")  # reported, not asserted
    lst.release()


# ---- Transfers ------------------------------------------------------------------------
def test_read_scattered_blocks_telemetry_and_repost(engine, target):
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    n = SIZE // BLOCK
    lst = engine.prepare(blocks(local.ctypes.data, n))
    rem = engine.prepare(blocks(target.hello["addr"], n), seg)
    # 3 runs: local 10..13 <- remote 100..103 (merged), 50 <- 7, 51 <- 9 (not adjacent remotely)
    li = np.array([10, 11, 12, 13, 50, 51], np.int32)
    ri = np.array([100, 101, 102, 103, 7, 9], np.uint64)
    t = engine.make_transfer(ferry.Opcode.READ, lst, li, rem, ri)
    lst.release()  # the transfer keeps what it needs
    with pytest.raises(ferry.FailedPrecondition):
        t.status()  # never posted
    t.post()
    t.wait(timeout=30)
    assert t.done() and t.status() == (ferry.TransferState.COMPLETED, None)
    for lb, rb in zip(li, ri):
        assert sha(local[lb * BLOCK:(lb + 1) * BLOCK]) == sha(remote_block(1, int(rb)))
    tel = t.telemetry()
    assert tel.bytes == 6 * BLOCK and tel.entries == 3
    assert tel.start_us > 0 and tel.transfer_us > 0
    untouched = np.ones(n, bool)
    untouched[li] = False
    assert not local.reshape(n, BLOCK)[untouched].any()

    target.request("fill", seed=2)
    t.post()  # again, once done
    t.wait(timeout=30)
    for lb, rb in zip(li, ri):
        assert sha(local[lb * BLOCK:(lb + 1) * BLOCK]) == sha(remote_block(2, int(rb)))
    assert t.telemetry().start_us > tel.start_us
    t.release()
    assert t.released


def test_torch_tensors_as_rows_and_indices(engine, target):
    import torch
    local = torch.zeros(SIZE, dtype=torch.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    rows = torch.zeros((8, 3), dtype=torch.int64)
    rows[:, 0] = local.data_ptr() + torch.arange(8) * BLOCK
    rows[:, 1] = BLOCK
    lst = engine.prepare(rows)
    rem = engine.prepare(torch.from_numpy(blocks(target.hello["addr"], 8).astype(np.int64)), seg)
    with engine.make_transfer("read", lst, torch.tensor([0, 1]), rem,
                              torch.tensor([6, 2], dtype=torch.int32)) as t:
        t.post()
        t.wait(timeout=30)
    got = local.numpy()
    assert sha(got[:BLOCK]) == sha(remote_block(1, 6))
    assert sha(got[BLOCK:2 * BLOCK]) == sha(remote_block(1, 2))


def test_write_with_a_notification_and_strided_rows(engine, target):
    local = np.zeros(SIZE, np.uint8)
    local[:] = pattern(5, SIZE)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    half = SIZE // BLOCK // 2
    # every other local block -> the first half of the target, in order
    lst = engine.prepare(np.array([[local.ctypes.data, BLOCK, 0, 2 * BLOCK, half]], np.uint64))
    rem = engine.prepare(np.array([[target.hello["addr"], BLOCK, 0, BLOCK, half]], np.uint64), seg)
    idx = list(range(half))
    t = engine.make_transfer("write", lst, idx, rem, idx, notification=("kv-done", b"req-1"))
    t.post()
    t.wait(timeout=30)
    want = pattern(1, SIZE)
    want[:half * BLOCK] = local.reshape(-1, 2 * BLOCK)[:, :BLOCK].reshape(-1)
    notes = target.request("notifies", count=1)["notes"]
    assert [(n["name"], n["msg"]) for n in notes] == [("kv-done", "req-1")]
    assert notes[0]["sha"] == sha(want)  # the data was there when the notification came
    assert target.request("sha")["sha"] == sha(want)
    assert t.telemetry().entries == half  # strided local entries are not adjacent
    t.post(notification=("kv-done", "again"))  # replaces the transfer's own for this post
    t.wait(timeout=30)
    assert [n["msg"] for n in target.request("notifies", count=1)["notes"]] == ["again"]
    t.release()


def test_bad_pairs_are_refused_naming_them(engine, target):
    local = np.zeros(1 << 16, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    lst = engine.prepare(blocks(local.ctypes.data, 16))
    rem = engine.prepare(blocks(target.hello["addr"], 16), seg)
    short = engine.prepare([(target.hello["addr"], 16, 0)], seg)
    R = ferry.Opcode.READ
    with pytest.raises(ferry.InvalidArgument):
        engine.make_transfer(R, lst, [0, 1], rem, [0])
    with pytest.raises(ferry.InvalidArgument):
        engine.make_transfer(R, lst, [16], rem, [0])
    with pytest.raises(ferry.InvalidArgument):
        engine.make_transfer(R, lst, [0], short, [0])  # lengths differ
    with pytest.raises(ferry.InvalidArgument, match="position 2"):
        engine.make_transfer(R, lst, np.array([0, 1, -1], np.int64), rem, [0, 1, 2])
    with pytest.raises(ferry.InvalidArgument, match="position 0"):
        engine.make_transfer(R, lst, [0], rem, np.array([1 << 32], np.uint64))
    with pytest.raises(ferry.InvalidArgument):
        engine.make_transfer(R, lst, [0.5], rem, [0])
    with pytest.raises(ferry.InvalidArgument):
        engine.make_transfer(R, lst, np.zeros((1, 1), np.int64), rem, [0])
    with pytest.raises(ferry.InvalidArgument):
        engine.make_transfer("copy", lst, [0], rem, [0])
    with pytest.raises(ferry.InvalidArgument):
        engine.make_transfer(R, lst, [0], rem, [0], notification="just a string")


def test_repost_while_in_flight_is_refused_and_cancel_guarantees(engine, spawn):
    target = spawn("native", str(SIZE), '{"transfer_timeout": 60}')
    target.request("fill", seed=3)
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    n = SIZE // BLOCK
    lst = engine.prepare(blocks(local.ctypes.data, n))
    rem = engine.prepare(blocks(target.hello["addr"], n), seg)
    idx = np.arange(n, dtype=np.uint32)
    t = engine.make_transfer(ferry.Opcode.READ, lst, idx, rem, idx)
    t.post()
    t.wait(timeout=30)  # connections are up
    local[:] = 0
    target.pause()
    try:
        t.post()
        with pytest.raises(ferry.FailedPrecondition, match="still in flight"):
            t.post()
        assert not t.done()
        with pytest.raises(ferry.DeadlineExceeded, match="pending"):
            t.wait(timeout=0.05)
        t.cancel()
        state, error = t.status()
        assert state == ferry.TransferState.FAILED and isinstance(error, ferry.Cancelled)
        with pytest.raises(ferry.Cancelled):
            t.wait(timeout=5)
        snapshot = local.copy()
    finally:
        target.resume()
    # after cancel returned, no byte of the cancelled read lands any more
    t2 = engine.make_transfer(ferry.Opcode.READ, lst, [0], rem, [0])
    t2.post()
    t2.wait(timeout=30)  # the peer is serving again (and answered the cancelled requests)
    assert np.array_equal(local[BLOCK:], snapshot[BLOCK:])
    t.post()  # may be posted again right away
    t.wait(timeout=30)
    assert sha(local) == sha(pattern(3, SIZE))
    for x in (t, t2):
        x.release()


def test_batch_cancel(engine, spawn):
    target = spawn("native", str(SIZE), '{"transfer_timeout": 60}')
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    engine.read(seg, local, target.hello["addr"], 16)
    target.pause()
    try:
        batch = engine.read_async(seg, [local.ctypes.data], [target.hello["addr"]], [SIZE])
        batch.cancel()
        with pytest.raises(ferry.Cancelled):
            batch.wait(timeout=5)
        batch.free()
    finally:
        target.resume()


def test_dropped_transfers_and_lists_are_released(engine, target):
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    lst = engine.prepare(blocks(local.ctypes.data, 4))
    rem = engine.prepare(blocks(target.hello["addr"], 4), seg)
    handles = []
    for _ in range(50):
        t = engine.make_transfer(ferry.Opcode.READ, lst, [0], rem, [1])
        t.post()
        handles.append(t.handle)
        del t  # collected, possibly in flight: cancelled and released
    import gc
    gc.collect()
    for h in handles:
        with pytest.raises(ferry.InvalidArgument):
            engine._native.transfer_state(h)  # forgotten
    h = lst.handle
    del lst
    gc.collect()
    with pytest.raises(ferry.InvalidArgument):
        engine._native.desc_list_entries(h)
    engine.unregister(local)  # nothing in flight pins it


# ---- Metadata ---------------------------------------------------------------------------
def test_export_and_import_metadata_between_processes(engine, target):
    md = bytes.fromhex(target.request("metadata")["hex"])
    seg = engine.import_metadata(md)
    assert seg.peer_id == target.hello["peer_id"]
    assert engine.import_metadata(md) is seg  # cached, like open_segment
    assert engine.open_segment(target.hello["peer_id"]) is seg
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    rem = engine.prepare(blocks(target.hello["addr"], SIZE // BLOCK), seg)
    lst = engine.prepare(blocks(local.ctypes.data, SIZE // BLOCK))
    idx = list(range(SIZE // BLOCK))
    with engine.make_transfer(ferry.Opcode.READ, lst, idx, rem, idx) as t:
        t.post()
        t.wait(timeout=30)
    assert sha(local) == sha(pattern(1, SIZE))
    mine = engine.export_metadata()
    assert isinstance(mine, bytes) and mine
    with pytest.raises(ferry.InvalidArgument):
        engine.import_metadata(b"not metadata at all")
    with pytest.raises(ferry.InvalidArgument):
        engine.import_metadata(md[: len(md) // 2])


# ---- Metrics ------------------------------------------------------------------------------
def test_metrics_count_bytes_and_the_endpoint_serves_them(target):
    with ferry.Engine(metrics_address="127.0.0.1:0") as engine:
        address = engine.metrics_address
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        local = np.zeros(SIZE, np.uint8)
        engine.register(local)
        seg = engine.open_segment(target.hello["peer_id"])
        engine.read(seg, local, target.hello["addr"], SIZE)
        engine.write(seg, local, target.hello["addr"], 1000)
        engine.notify(seg, "n", b"m")
        m = engine.metrics()
        reads = [r for r in m["routes"] if r["opcode"] == "read" and r["peer"] == seg.peer_id]
        writes = [r for r in m["routes"] if r["opcode"] == "write" and r["peer"] == seg.peer_id]
        assert sum(r["bytes_completed"] for r in reads) == SIZE
        assert sum(r["bytes_completed"] for r in writes) == 1000
        assert sum(r["requests_failed"] + r["bytes_failed"] for r in reads + writes) == 0
        assert m["counters"]["notifications_sent"] == 1
        lat = m["transfer_latency"]
        assert lat["count"] >= 2 and sum(lat["counts"]) == lat["count"]
        assert len(lat["counts"]) == len(lat["bounds_us"]) + 1
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
            assert r.status == 200
            body = r.read().decode()
        served = _samples(body)
        key = ("ferry_bytes_total", (("op", "read"), ("outcome", "completed"),
                                     ("peer", seg.peer_id), ("transport", seg.info().transport)))
        assert served[key] == SIZE  # the bytes read, as served over HTTP
        assert served[("ferry_notifications_sent_total", ())] == 1
        assert {k: v for k, v in served.items() if k[0] == "ferry_bytes_total"} == {
            k: v for k, v in _samples(engine.metrics_text()).items() if k[0] == "ferry_bytes_total"}
    with ferry.Engine() as off:
        assert off.metrics_address == ""


def _samples(text: str) -> dict:
    """{(metric, sorted label pairs): value} of Prometheus text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'(\w+)(?:\{(.*)\})? (\S+)', line)
        assert m, f"not a sample line: {line!r}"
        labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


# ---- Threads ------------------------------------------------------------------------------
def test_prepared_transfers_from_many_threads(engine, target):
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    n = SIZE // BLOCK
    lst = engine.prepare(blocks(local.ctypes.data, n))
    rem = engine.prepare(blocks(target.hello["addr"], n), seg)
    errors = []

    def worker(w):
        try:
            mine = list(range(w, n, 8))
            with engine.make_transfer(ferry.Opcode.READ, lst, mine, rem, mine[::-1]) as t:
                for _ in range(3):
                    t.post()
                    t.wait(timeout=30)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    want = pattern(1, SIZE).reshape(n, BLOCK)
    got = local.reshape(n, BLOCK)
    for w in range(8):
        mine = list(range(w, n, 8))
        for lb, rb in zip(mine, mine[::-1]):
            assert sha(got[lb]) == sha(want[rb])


def test_waiting_releases_the_gil(engine, spawn):
    """A thread blocked in one long native wait must let this thread run: it
    resumes the paused peer, and only then can the transfer complete. Were the
    GIL held, the resume would come after the wait (and the transfer's
    deadline) had passed."""
    target = spawn("native", str(SIZE), '{"transfer_timeout": 60}')
    target.request("fill", seed=8)
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    lst = engine.prepare(blocks(local.ctypes.data, 8))
    rem = engine.prepare(blocks(target.hello["addr"], 8), seg)
    t = engine.make_transfer(ferry.Opcode.READ, lst, list(range(8)), rem, list(range(8)))
    t.post()
    t.wait(timeout=30)
    local[:] = 0
    outcome = {}
    target.pause()
    try:
        t.post()

        def waiter():
            try:
                engine._native.wait_transfer(t.handle, 60.0)  # one call, no Python steps
                outcome["ok"] = True
            except ferry.FerryError as err:
                outcome["error"] = err

        w = threading.Thread(target=waiter)
        w.start()
        time.sleep(0.2)  # let it block (not required for correctness)
    finally:
        target.resume()
    w.join(90)
    assert outcome == {"ok": True}, outcome
    assert sha(local[:8 * BLOCK]) == sha(pattern(8, SIZE)[:8 * BLOCK])
    t.release()
