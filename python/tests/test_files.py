"""File regions (Engine.register_file, issue 30): cpu memory written to a
range of a file and read back, through the engine's own segment (the local
transport) and a second engine's over tcp (the engine that owns the file
does the I/O); this engine's file as the local side of transfers to a peer
over tcp and shm; the range checks, read-only registrations and a descriptor
closed by its owner; a writer killed mid-batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import ferry


@pytest.fixture(params=["local", "tcp"])
def pair(request):
    """(initiator, owner of the files, segment of the owner): one engine and
    its own segment for "local", two engines for "tcp"."""
    with ferry.Engine(transport=request.param, listen_host="127.0.0.1") as a:
        if request.param == "local":
            yield a, a, a.open_segment(a.peer_id)
            return
        with ferry.Engine(transport="tcp", listen_host="127.0.0.1") as b:
            yield a, b, a.open_segment(b.peer_id)


def make_file(tmp_path, size: int) -> str:
    path = tmp_path / "kv.bin"
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def test_write_then_read_back(pair, tmp_path):
    a, owner, seg = pair
    path = make_file(tmp_path, 1 << 20)
    base = owner.register_file(path, offset=4096, length=512 << 10)
    a.query_segment(seg)  # the initiator learns of the new region
    src = np.random.default_rng(1).integers(0, 256, 256 << 10, dtype=np.uint8)
    dst = np.zeros_like(src)
    a.register(src)
    a.register(dst)
    a.write_many(seg, [src[:4096], src[4096:70000]], [base, base + 100003])
    with open(path, "rb") as f:
        data = f.read()
    assert data[4096:8192] == src[:4096].tobytes()
    assert data[4096 + 100003:4096 + 100003 + 65904] == src[4096:70000].tobytes()
    a.read_many(seg, [dst[:4096], dst[4096:70000]], [base, base + 100003])
    assert np.array_equal(dst[:70000], src[:70000])
    counters = owner.metrics()["counters"]
    assert counters["file_direct_ops"] + counters["file_buffered_ops"] == 4
    # The owner staged the peer's entries (tcp) through host buffers, all
    # let go by now that the replies were sent; "local" stages nothing.
    staged = 0 if a is owner else 4096 + 65904
    assert counters["target_staging_bytes_peak"] >= staged
    assert (counters["target_staging_bytes_peak"] == 0) == (a is owner)
    assert "ferry_target_staging_bytes_peak " in owner.metrics_text()
    owner.unregister(base)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_own_file_to_and_from_a_peers_memory(transport, tmp_path):
    """This engine's file region as the local side of transfers to a peer's
    memory (staged through host buffers here): file -> peer, peer -> file."""
    from conftest import same_host_copy_refusal

    if transport == "shm" and same_host_copy_refusal():
        pytest.skip(f"this host refuses same-host copies: {same_host_copy_refusal()}")
    path = make_file(tmp_path, 1 << 20)
    original = np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8)
    original.tofile(path)
    with ferry.Engine(transport=transport, listen_host="127.0.0.1") as a, \
            ferry.Engine(transport=transport, listen_host="127.0.0.1") as b:
        base = a.register_file(path)
        theirs = np.zeros(1 << 20, np.uint8)
        b.register(theirs)
        seg = a.open_segment(b.peer_id)
        a.write(seg, base + 8192, theirs.ctypes.data, 65536)  # file -> peer
        a.write(seg, base + 100003, theirs.ctypes.data + 200000, 777)
        assert np.array_equal(theirs[:65536], original[8192:8192 + 65536])
        assert np.array_equal(theirs[200000:200777], original[100003:100780])
        theirs[:] = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
        a.read(seg, base + 4096, theirs.ctypes.data + 4096, 12288)  # peer -> file
        with open(path, "rb") as f:
            data = np.frombuffer(f.read(), np.uint8)
        assert np.array_equal(data[4096:16384], theirs[4096:16384])
        assert np.array_equal(data[:4096], original[:4096])  # nothing else touched
        assert np.array_equal(data[16384:], original[16384:])
        counters = a.metrics()["counters"]
        assert counters["file_direct_ops"] + counters["file_buffered_ops"] == 3


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_prepared_pages_from_own_file_notify_after_the_data(transport, tmp_path):
    """Prepared lists over this engine's file region: 32 pages of 32 KiB in
    a shuffled order to a peer, with a notification; once the peer has the
    notification it has every byte."""
    from conftest import same_host_copy_refusal

    if transport == "shm" and same_host_copy_refusal():
        pytest.skip(f"this host refuses same-host copies: {same_host_copy_refusal()}")
    page, pages = 32768, 32
    path = make_file(tmp_path, page * pages)
    original = np.random.default_rng(5).integers(0, 256, page * pages, dtype=np.uint8)
    original.tofile(path)
    with ferry.Engine(transport=transport, listen_host="127.0.0.1") as a, \
            ferry.Engine(transport=transport, listen_host="127.0.0.1") as b:
        base = a.register_file(path)
        theirs = np.zeros(page * pages, np.uint8)
        b.register(theirs)
        seg = a.open_segment(b.peer_id)
        local = a.prepare(np.array([[base + k * page, page, 0] for k in range(pages)], np.uint64))
        remote = a.prepare(np.array([[theirs.ctypes.data + k * page, page, 0]
                                     for k in range(pages)], np.uint64), seg)
        order = np.random.default_rng(6).permutation(pages).astype(np.uint32)
        transfer = a.make_transfer(ferry.Opcode.WRITE, local, order, remote,
                                   np.arange(pages, dtype=np.uint32), ("kv", b"ready"))
        transfer.post()
        deadline = time.monotonic() + 30
        notes = []
        while not notes and time.monotonic() < deadline:
            notes = b.notifications()
            time.sleep(0.001)
        assert [(n.name, n.message) for n in notes] == [("kv", b"ready")]
        for k in range(pages):
            want = original[order[k] * page:(order[k] + 1) * page]
            assert np.array_equal(theirs[k * page:(k + 1) * page], want), f"page {k}"
        transfer.wait(30)


def test_direct_false_keeps_every_op_in_the_page_cache(tmp_path):
    path = make_file(tmp_path, 65536)
    with ferry.Engine(transport="local", listen_host="127.0.0.1") as e:
        seg = e.open_segment(e.peer_id)
        base = e.register_file(path, direct=False)
        buf = np.full(8192, 3, dtype=np.uint8)
        e.register(buf)
        e.write(seg, buf, base)
        e.read(seg, buf, base + 8192)
        counters = e.metrics()["counters"]
        assert counters["file_direct_ops"] == 0 and counters["file_buffered_ops"] == 2


def test_range_past_the_end_and_missing_file(tmp_path):
    path = make_file(tmp_path, 65536)
    with ferry.Engine(listen_host="127.0.0.1") as e:
        with pytest.raises(ferry.InvalidArgument, match="past its end"):
            e.register_file(path, offset=4096, length=65536, writable=False)
        with pytest.raises(ferry.NotFound, match="missing"):
            e.register_file(path + ".missing")
        with pytest.raises(ferry.InvalidArgument):
            e.register_file(True)


def test_read_only_file_refuses_writes_naming_it(pair, tmp_path):
    a, owner, seg = pair
    path = make_file(tmp_path, 65536)
    base = owner.register_file(path, writable=False)
    a.query_segment(seg)
    buf = np.full(4096, 7, dtype=np.uint8)
    a.register(buf)
    with pytest.raises(ferry.InvalidArgument, match="read-only") as err:
        a.write(seg, buf, base)
    assert path in str(err.value)
    a.read(seg, buf, base)
    assert not buf.any()


def test_descriptor_closed_by_its_owner(pair, tmp_path):
    a, owner, seg = pair
    path = make_file(tmp_path, 65536)
    fd = os.open(path, os.O_RDWR)
    base = owner.register_file(fd, durable=True)
    os.close(fd)  # the engine opened the file itself
    a.query_segment(seg)
    buf = np.arange(8192, dtype=np.uint8) % 251
    back = np.zeros_like(buf)
    a.register(buf)
    a.register(back)
    a.write(seg, buf, base + 8192)
    a.read(seg, back, base + 8192)
    assert np.array_equal(buf, back)


# A child that writes KV pages to a durable file region in batches of 16 and
# prints each batch's first index once the batch completed (so durable).
WRITER = r'''
import json, sys
import numpy as np
import ferry

path, pages, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
e = ferry.Engine(transport="local", listen_host="127.0.0.1", file_queue_depth=4)
seg = e.open_segment(e.peer_id)
base = e.register_file(path, durable=True)
buf = np.empty(pages * size, dtype=np.uint8)
for k in range(pages):
    buf[k * size:(k + 1) * size] = np.random.default_rng(k).integers(0, 256, size, np.uint8)
e.register(buf)
print(json.dumps({"ready": True}), flush=True)
for first in range(0, pages, 16):
    ks = range(first, min(first + 16, pages))
    e.write_many(seg, [buf[k * size:(k + 1) * size] for k in ks], [base + k * size for k in ks])
    print(json.dumps({"durable": first}), flush=True)
'''


@pytest.mark.multiprocess
def test_killed_mid_batch_entries_reported_durable_are_in_the_file(tmp_path):
    """SIGKILL while batches of durable writes are in flight: every page of a
    batch reported complete is in the file, whole, as a new process reads it."""
    from conftest import REPLY_TIMEOUT, child_env

    pages, size = 1024, 16384
    path = make_file(tmp_path, pages * size)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), path, str(pages), str(size)],
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        reported = []
        for line in proc.stdout:  # until 8 batches are reported (or the child finished)
            reported.append(json.loads(line)["durable"])
            if len(reported) == 8:
                break
        proc.kill()
    finally:
        proc.kill()
        proc.wait(timeout=REPLY_TIMEOUT)
    assert reported, "the writer reported no batch"
    with open(path, "rb") as f:
        data = f.read()
    for first in reported:
        for k in range(first, min(first + 16, pages)):
            want = np.random.default_rng(k).integers(0, 256, size, np.uint8).tobytes()
            assert data[k * size:(k + 1) * size] == want, f"page {k} reported durable"
