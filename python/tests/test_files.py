"""File regions (Engine.register_file, issue 30): cpu memory written to a
range of a file and read back, through the engine's own segment (the local
transport) and a second engine's over tcp (the engine that owns the file
does the I/O); the range checks, read-only registrations and a descriptor
closed by its owner; a writer killed mid-batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    owner.unregister(base)


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
