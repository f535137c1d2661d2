"""Shared memory a same-host peer maps (issue 31, "Mapped segments" in
docs/architecture.md): Engine.register(fd=, fd_offset=), Engine.allocate_shared /
free_shared, and the managed buffers of the Mooncake drop-in (ferry/_pool.py),
whose arenas are sealed memfds.

The two-process tests prove the mapping is used: the target process is stopped
(SIGSTOP), so nothing it would have to do can happen, and the initiator's write
and read over "shm" still complete with the right bytes.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import hashlib
import logging
import mmap
import os

import numpy as np
import pytest

import ferry
from ferry import _pool

SIZE = 1 << 20
PAGE = mmap.PAGESIZE


def sha(data) -> str:
    return hashlib.sha256(np.asarray(data).tobytes()).hexdigest()


@pytest.fixture
def engine():
    with ferry.Engine() as e:
        yield e


def memfd(size: int, seals: int = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) -> int:
    fd = os.memfd_create("ferry-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def address(m: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def memfd_fds(name: str) -> set[int]:
    """This process's descriptors that are memfds called ``name``."""
    found = set()
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{entry}").startswith(f"/memfd:{name} "):
                found.add(int(entry))
        except OSError:
            pass  # closed meanwhile (e.g. listdir's own descriptor)
    return found


# ---- Engine.register with a descriptor ---------------------------------------------
def test_register_a_sealed_memfd_mapping(engine):
    fd = memfd(4 * PAGE)
    try:
        whole = mmap.mmap(fd, 4 * PAGE, flags=mmap.MAP_SHARED)
        half = mmap.mmap(fd, 2 * PAGE, flags=mmap.MAP_SHARED, offset=2 * PAGE)
        addr = engine.register(address(whole), PAGE, location="cpu", fd=fd)
        # A range inside a mapping, and a mapping of the file from an offset:
        # fd_offset names the file offset of the range's first byte.
        inside = engine.register(address(whole) + PAGE + 100, PAGE, location="cpu", fd=fd,
                                 fd_offset=PAGE + 100)
        upper = engine.register(address(half), 2 * PAGE, location="cpu", fd=fd,
                                fd_offset=2 * PAGE)
    finally:
        os.close(fd)  # the engine keeps its own duplicate
    assert engine.registered() == {addr: PAGE, inside: PAGE, upper: 2 * PAGE}
    # This engine's own transfers (its own segment) reach them.
    seg = engine.open_segment(engine.peer_id)
    src = np.arange(2 * PAGE, dtype=np.uint8)
    engine.register(src)
    engine.write(seg, src[:PAGE], addr)
    engine.write(seg, src, upper)
    assert whole[:PAGE] == src[:PAGE].tobytes()
    assert whole[2 * PAGE:] == src.tobytes()  # the same pages, seen through both mappings
    engine.unregister_many([addr, inside, upper])


def test_register_refuses_what_a_peer_could_not_map_safely(engine):
    # Not sealed against shrinking: a peer's copy could fault.
    fd = memfd(PAGE, seals=0)
    try:
        m = mmap.mmap(fd, PAGE, flags=mmap.MAP_SHARED)
        with pytest.raises(ferry.InvalidArgument, match="F_SEAL_SHRINK"):
            engine.register(address(m), PAGE, location="cpu", fd=fd)
    finally:
        os.close(fd)
    fd = memfd(2 * PAGE)
    try:
        m = mmap.mmap(fd, 2 * PAGE, flags=mmap.MAP_SHARED)
        # The wrong file offset: the range maps offset 0, not PAGE.
        with pytest.raises(ferry.InvalidArgument, match=f"at file offset 0, not {PAGE}"):
            engine.register(address(m), PAGE, location="cpu", fd=fd, fd_offset=PAGE)
        # Past the end of the file.
        with pytest.raises(ferry.InvalidArgument, match="past the end"):
            engine.register(address(m), 2 * PAGE, location="cpu", fd=fd, fd_offset=PAGE)
        # Memory that is not a mapping of the descriptor at all.
        private = np.zeros(PAGE, np.uint8)
        with pytest.raises(ferry.InvalidArgument, match="fd and fd_offset"):
            engine.register(private, location="cpu", fd=fd)
        with pytest.raises(ferry.InvalidArgument, match="negative"):
            engine.register(address(m), PAGE, location="cpu", fd=fd, fd_offset=-1)
        with pytest.raises(ferry.InvalidArgument, match="not a file descriptor"):
            engine.register(address(m), PAGE, location="cpu", fd=-1)
    finally:
        os.close(fd)
    assert engine.registered() == {}


# ---- allocate_shared / free_shared ----------------------------------------------------
def test_allocate_shared_and_free_shared(engine):
    addr = engine.allocate_shared(SIZE)
    assert ctypes.string_at(addr, SIZE) == bytes(SIZE)  # zero-filled
    seg = engine.open_segment(engine.peer_id)
    src = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8)
    engine.register(src)
    engine.write(seg, src, addr)
    assert ctypes.string_at(addr, SIZE) == src.tobytes()
    back = np.zeros(SIZE, np.uint8)
    engine.register(back)
    engine.read(seg, back, addr)
    assert sha(back) == sha(src)
    # Not exported: for this engine's own transfers only.
    private = engine.allocate_shared(PAGE, location="cpu:0", exported=False)
    ctypes.memset(private, 9, PAGE)
    engine.write(seg, private, addr, PAGE)  # as the source of this engine's own request
    assert ctypes.string_at(addr, PAGE) == bytes([9]) * PAGE
    engine.free_shared(private)
    engine.free_shared(addr)
    with pytest.raises(ferry.FerryError):
        engine.write(seg, src, addr)  # not registered any more
    with pytest.raises(ferry.NotFound):
        engine.free_shared(addr)
    plain = np.zeros(PAGE, np.uint8)
    with pytest.raises(ferry.NotFound):
        engine.free_shared(engine.register(plain))  # registered, but not shared memory
    for length in (0, -1):
        with pytest.raises(ferry.InvalidArgument):
            engine.allocate_shared(length)
    with pytest.raises(ferry.FerryError):
        engine.allocate_shared(PAGE, location="cuda:0")  # not host memory


# ---- Managed buffers (ferry/_pool.py) ----------------------------------------------
def test_managed_pool_arenas_are_sealed_memfds_and_each_buffer_is_registered_exactly(engine):
    before = memfd_fds("ferry-managed")
    pool = _pool.ManagedPool(engine, arena_size=4 << 20)
    a = pool.allocate(1000)
    b = pool.allocate(5000)
    assert engine.registered() == {a: 1000, b: 5000}  # the pieces, never the arena
    arena_fds = memfd_fds("ferry-managed") - before
    assert arena_fds  # the pool's, mmap's and the engine's duplicates
    for fd in arena_fds:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
    # Both pieces are shared mappings of the same memfd, at their offsets.
    with open("/proc/self/maps") as maps:
        lines = [line for line in maps if "/memfd:ferry-managed" in line]
    covering = [line for line in lines
                if int(line.split("-")[0], 16) <= a < int(line.split()[0].split("-")[1], 16)]
    assert covering and covering[0].split()[1] == "rw-s"
    pool.free(a)
    pool.free(b)
    assert engine.registered() == {}
    del pool
    gc.collect()
    assert memfd_fds("ferry-managed") - before == set()  # the arena's descriptor is closed


def test_managed_pool_falls_back_to_anonymous_memory_without_memfd(engine, monkeypatch, caplog):
    def unavailable(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(_pool.os, "memfd_create", unavailable)
    monkeypatch.setattr(_pool, "_fallback_logged", False)
    pool = _pool.ManagedPool(engine, arena_size=2 << 20)
    with caplog.at_level(logging.WARNING, logger="ferry"):
        a = pool.allocate(3 << 20)  # a second arena: logged once only
        b = pool.allocate(100)
    assert engine.registered() == {a: 3 << 20, b: 100}
    notes = [r for r in caplog.records if "memfd is not available" in r.getMessage()]
    assert len(notes) == 1 and "Function not implemented" in notes[0].getMessage()
    ctypes.memset(a, 7, 3 << 20)
    pool.free(a)
    pool.free(b)


# ---- A stopped peer's memory, reached through the mapping ---------------------------
def shm_or_skip(seg) -> None:
    from conftest import same_host_copy_refusal

    refusal = same_host_copy_refusal()
    if refusal:
        pytest.skip(f"this host refuses same-host copies: {refusal}")
    assert seg.info().transport == "shm"


@pytest.mark.parametrize("mode", ["mooncake", "native-shared"])
def test_a_stopped_peers_shared_memory_is_written_and_read_through_the_mapping(spawn, mode):
    """The target (a Mooncake drop-in managed buffer, or Engine.allocate_shared
    memory) is stopped: its engine answers nothing, yet the write and the read
    complete (each bounded by the engine's transfer_timeout) with the right
    bytes, and the target sees them once it runs again. The control: an engine
    with map_shared_memory off goes through the stopped target and times out."""
    args = (str(SIZE), "rdma") if mode == "mooncake" else (str(SIZE),)
    target = spawn(mode, *args)
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    with ferry.Engine(transfer_timeout=30.0) as e, \
            ferry.Engine(map_shared_memory=0, transfer_timeout=0.3) as through_peer:
        src = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
        back = np.zeros(SIZE, np.uint8)
        e.register_many([src, back])
        through_peer.register(src)
        seg = e.open_segment(peer)
        shm_or_skip(seg)
        useg = through_peer.open_segment(peer)
        # Both links open while the target runs.
        e.read(seg, back[:64], remote)
        through_peer.write(useg, src[:64], remote)
        target.pause()
        try:
            e.write(seg, src, remote)
            e.read(seg, back, remote)
            assert sha(back) == sha(src)
            # A piece in the middle, at odd offsets.
            e.write(seg, src[:777], remote + 12345)
            e.read(seg, back[:SIZE // 2], remote + 12345 - 1000)
            with pytest.raises(ferry.DeadlineExceeded):
                through_peer.write(useg, src[:PAGE], remote)
        finally:
            target.resume()
    expected = src.copy()
    expected[12345:12345 + 777] = src[:777]
    assert sha(back[:SIZE // 2]) == sha(expected[12345 - 1000:12345 - 1000 + SIZE // 2])
    assert target.request("sha")["sha"] == sha(expected)


# ---- Forked children --------------------------------------------------------------
def test_a_forked_childs_writes_to_managed_buffers_stay_in_the_child(engine):
    """Arenas are shared mappings, which fork() would leave shared: the child
    maps them privately (copy-on-write) right after the fork, so it starts
    with the buffers' bytes and its writes never reach the parent."""
    pool = _pool.ManagedPool(engine, arena_size=4 << 20)
    a = pool.allocate(2 * PAGE)
    b = pool.allocate(1000)
    ctypes.memset(a, 0x11, 2 * PAGE)
    ctypes.memset(b, 0x22, 1000)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it saw and wrote, never return into pytest
        try:
            seen = ctypes.string_at(a, 2 * PAGE) + ctypes.string_at(b, 1000)
            ctypes.memset(a, 0x33, 2 * PAGE)
            ctypes.memset(b, 0x44, 1000)
            own = ctypes.string_at(a, 2 * PAGE) + ctypes.string_at(b, 1000)
            os.write(writer, hashlib.sha256(seen).digest() + hashlib.sha256(own).digest())
        finally:
            os._exit(0)
    os.close(writer)
    try:
        report = b""
        while len(report) < 64:
            chunk = os.read(reader, 64 - len(report))
            assert chunk, "the child died before reporting"
            report += chunk
    finally:
        os.close(reader)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    before = b"\x11" * (2 * PAGE) + b"\x22" * 1000
    after = b"\x33" * (2 * PAGE) + b"\x44" * 1000
    assert report[:32] == hashlib.sha256(before).digest()  # the child started with the bytes
    assert report[32:] == hashlib.sha256(after).digest()  # and read back its own writes
    # The parent's buffers are untouched, and still its engine's registered memory.
    assert ctypes.string_at(a, 2 * PAGE) + ctypes.string_at(b, 1000) == before
    assert engine.registered() == {a: 2 * PAGE, b: 1000}
    pool.free(a)
    pool.free(b)
