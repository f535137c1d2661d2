"""The native Python API (ferry.Engine) against a target in another process,
and between engines of one process."""

from __future__ import annotations

import gc
import hashlib
import socket
import sys
import threading
import weakref

import numpy as np
import pytest
import torch

import ferry
from conftest import free_port
from peer import pattern

SIZE = 8 << 20


def sha(data) -> str:
    return hashlib.sha256(np.asarray(data).tobytes()).hexdigest()


@pytest.fixture
def engine():
    with ferry.Engine() as e:
        yield e


@pytest.fixture(params=["auto", "tcp"])
def remote_engine(request):
    """An engine with the transport under test, and the transport a peer
    process on this host gets with it (auto: shm, or tcp where this machine
    refuses same-host copies)."""
    from conftest import same_host_copy_refusal
    same_host = "tcp" if same_host_copy_refusal() else "shm"
    with ferry.Engine(transport=request.param) as e:
        yield e, {"auto": same_host, "tcp": "tcp"}[request.param]


@pytest.fixture
def target(spawn):
    return spawn("native", str(SIZE))


# ---- Package and engine basics ------------------------------------------------------
def test_version_capabilities_and_identity(engine):
    assert ferry.__version__ and ferry.__version__ == engine.capabilities["version"]
    caps = engine.capabilities
    assert caps["wire_version_min"] <= caps["wire_version_max"]
    assert "tcp" in caps["transports"] and "write" in caps["features"]
    host, port = engine.peer_id.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == engine.rpc_port > 0
    assert engine.options["transfer_timeout"] == 30.0


def test_options_are_passed_and_unknown_ones_rejected():
    with ferry.Engine(transfer_timeout=7.5, tcp_streams=3, local_name="me", wait_spin=0.0005,
                      tcp_send_buffer=1 << 20) as e:
        assert e.options["transfer_timeout"] == 7.5
        assert e.options["tcp_streams"] == 3
        assert e.options["wait_spin"] == pytest.approx(0.0005)
        assert e.options["tcp_send_buffer"] == 1 << 20
        assert e.local_name == "me"
    with pytest.raises(TypeError, match="unknown option"):
        ferry.Engine(no_such_option=1)


def test_close_is_idempotent_and_later_calls_fail():
    e = ferry.Engine()
    buf = np.zeros(4096, np.uint8)
    e.register(buf)
    with e:
        pass
    assert e.closed
    e.close()
    assert not e.registered()
    with pytest.raises(ferry.FailedPrecondition, match="closed"):
        e.register(np.zeros(16, np.uint8))


def test_exception_hierarchy():
    codes = {}
    for name in ("Unavailable", "InvalidArgument", "NotFound", "AlreadyExists",
                 "FailedPrecondition", "DeadlineExceeded", "ResourceExhausted", "DataLoss",
                 "Internal", "Unimplemented", "Cancelled"):
        cls = getattr(ferry, name)
        assert issubclass(cls, ferry.FerryError)
        codes[cls.code] = name
    assert len(codes) == 11  # distinct codes
    e = ferry.InvalidArgument("bad thing", 3, "INVALID_ARGUMENT")
    assert (e.code, e.code_name, e.message) == (3, "INVALID_ARGUMENT", "bad thing")
    assert str(e) == "INVALID_ARGUMENT: bad thing" and isinstance(e, ValueError)


# ---- Registration ---------------------------------------------------------------------
def test_register_int_address(engine):
    buf = np.zeros(1 << 16, np.uint8)
    addr = engine.register(buf.ctypes.data, buf.nbytes)
    assert addr == buf.ctypes.data and engine.registered() == {addr: buf.nbytes}
    engine.unregister(addr)
    assert engine.registered() == {}
    with pytest.raises(ferry.InvalidArgument, match="length"):
        engine.register(buf.ctypes.data)


def test_register_buffers_keeps_them_alive_and_pinned(engine):
    buf = np.zeros(1 << 16, np.uint8)
    before = sys.getrefcount(buf)
    addr = engine.register(buf)
    assert addr == buf.ctypes.data
    assert sys.getrefcount(buf) > before  # the engine holds it
    info = engine.query_segment(engine.open_segment(engine.peer_id))
    assert (addr, buf.nbytes) in [(r.addr, r.length) for r in info.regions]
    engine.unregister(buf)
    assert engine.registered() == {} and sys.getrefcount(buf) == before

    ba = bytearray(4096)
    engine.register(ba)
    with pytest.raises(BufferError):
        ba.extend(b"x" * 100000)  # cannot move while registered
    engine.unregister(ba)
    ba.extend(b"x")


def test_register_torch_tensor_keeps_it_alive(engine):
    t = torch.zeros(1024, 16, dtype=torch.float16)
    ref = weakref.ref(t)
    addr = engine.register(t)
    assert addr == t.data_ptr() and engine.registered() == {addr: t.numel() * 2}
    del t
    gc.collect()
    assert ref() is not None  # kept alive while registered
    engine.unregister(addr)
    gc.collect()
    assert ref() is None


def test_register_many_is_all_or_nothing(engine):
    a, b = np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)
    engine.register(b)
    with pytest.raises(ferry.AlreadyExists):
        engine.register_many([a, b])
    assert list(engine.registered()) == [b.ctypes.data]
    engine.unregister(b)
    addrs = engine.register_many([a, b])
    assert addrs == [a.ctypes.data, b.ctypes.data]
    engine.unregister_many(addrs)
    assert engine.registered() == {}


def test_register_errors(engine):
    buf = np.zeros(4096, np.uint8)
    with pytest.raises(ferry.InvalidArgument):
        engine.register(buf.ctypes.data, 0)
    with pytest.raises(ferry.InvalidArgument):
        engine.register(0, 4096)
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        engine.register(b"immutable bytes")
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        engine.register(np.zeros((64, 64))[:, 1])
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        engine.register(torch.zeros(64, 64).t())
    with pytest.raises(ferry.InvalidArgument):
        engine.register(object())
    with pytest.raises(ferry.InvalidArgument):
        engine.register(buf, length=buf.nbytes + 1)
    engine.register(buf)
    with pytest.raises(ferry.AlreadyExists) as info:
        engine.register(buf[100:200])
    assert info.value.code_name == "ALREADY_EXISTS" and "overlaps" in info.value.message
    with pytest.raises(ferry.NotFound):
        engine.unregister(buf.ctypes.data + 1)
    with pytest.raises(ferry.NotFound):
        engine.unregister_many([buf.ctypes.data, 12345])
    assert engine.registered() == {}  # the good one was still unregistered


# ---- Transfers to another process -------------------------------------------------------
def test_sync_write_and_read_every_byte(remote_engine, target):
    engine, transport = remote_engine
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    assert engine.open_segment(target.hello["peer_id"]) is seg  # cached
    assert seg.info().transport == transport
    remote = target.hello["addr"]

    local[:] = pattern(1, SIZE)
    engine.write(seg, local, remote)  # whole buffer, length from the object
    assert target.request("sha")["sha"] == sha(local)

    # single ranges by address, unaligned
    data = pattern(2, 100_003)
    local[:data.size] = data
    engine.write(seg, local.ctypes.data, remote + 7, data.size)
    expected = pattern(1, SIZE)
    expected[7:7 + data.size] = data
    assert target.request("sha")["sha"] == sha(expected)

    # lists, scattered both ways
    offs = [(i * 65_537) % (SIZE - 5000) for i in range(64)]
    offs = sorted(set(offs))
    lens = [1 + (i * 977) % 4096 for i in range(len(offs))]
    src_offs = [i * 4096 for i in range(len(offs))]
    local[:] = pattern(3, SIZE)
    engine.write_many(seg, [local.ctypes.data + s for s in src_offs],
                      [remote + o for o in offs], lens)
    for s, o, n in zip(src_offs, offs, lens):
        expected[o:o + n] = local[s:s + n]
    assert target.request("sha")["sha"] == sha(expected)

    # reads back: whole buffer, then scattered ranges into a fresh buffer
    target.request("fill", seed=4)
    engine.read(seg, local, remote)
    assert sha(local) == sha(pattern(4, SIZE))
    back = np.zeros(SIZE, np.uint8)
    engine.register(back)
    engine.read_many(seg, [back.ctypes.data + s for s in src_offs], [remote + o for o in offs],
                     lens)
    want = np.zeros(SIZE, np.uint8)
    for s, o, n in zip(src_offs, offs, lens):
        want[s:s + n] = local[o:o + n]
    assert np.array_equal(back, want)

    # mixed requests, peer named by id
    back[:] = 0
    engine.transfer([ferry.Request(ferry.Opcode.READ, back[:1000], target.hello["peer_id"], remote),
                     ferry.Request(ferry.Opcode.WRITE, local[:10], seg, remote + SIZE - 10)])
    assert np.array_equal(back[:1000], local[:1000])
    assert target.request("sha", offset=SIZE - 10)["sha"] == sha(local[:10])


def test_torch_tensors_as_buffers(engine, target):
    t = torch.arange(0, 1 << 18, dtype=torch.int32)  # 1 MiB
    engine.register(t)
    seg = engine.open_segment(target.hello["peer_id"])
    engine.write(seg, t, target.hello["addr"])
    assert target.request("sha", length=t.numel() * 4)["sha"] == sha(t.numpy())
    r = torch.zeros_like(t)
    engine.register(r)
    engine.read(seg, r, target.hello["addr"])
    assert torch.equal(r, t)


def test_async_batches(engine, target):
    n, chunk = 100, 4096
    local = np.zeros(n * chunk, np.uint8)
    engine.register(local)
    local[:] = pattern(5, local.size)
    seg = engine.open_segment(target.hello["peer_id"])
    remote = target.hello["addr"]
    locals_ = [local.ctypes.data + i * chunk for i in range(n)]
    remotes = [remote + (n - 1 - i) * chunk for i in range(n)]  # reversed order
    with engine.write_async(seg, locals_, remotes, [chunk] * n) as batch:
        batch.wait(timeout=60)
        assert len(batch) == n and batch.done()
        assert batch.results() == [None] * n
        status = batch.status()
        assert status.state == ferry.TransferState.COMPLETED
        assert (status.submitted, status.completed, status.failed) == (n, n, 0)
    expected = local.reshape(n, chunk)[::-1].reshape(-1)
    assert target.request("sha", length=n * chunk)["sha"] == sha(expected)

    back = np.zeros_like(local)
    engine.register(back)
    batch = engine.read_async(seg, [back.ctypes.data + i * chunk for i in range(n)], remotes,
                              [chunk] * n)
    batch.wait(60)
    batch.free()
    batch.free()  # idempotent
    assert np.array_equal(back, local)

    # a batch with one bad request: per-request results name it
    batch = engine.submit([ferry.Request(ferry.Opcode.WRITE, local[:10], seg, remote),
                           ferry.Request(ferry.Opcode.WRITE, local[:10], seg, remote + SIZE - 5),
                           ferry.Request(ferry.Opcode.READ, back[:10], seg, remote)])
    results = batch.results(timeout=60)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], ferry.InvalidArgument) and "refused" in results[1].message
    with pytest.raises(ferry.InvalidArgument, match="request 1"):
        batch.wait(60)
    assert batch.status().state == ferry.TransferState.FAILED
    batch.free()


def test_request_columns_take_lists_and_integer_arrays(engine, target):
    """write_many / read_many / *_async hand their lists to C++ in one pass
    (transfer_sync_columns, submit_columns): lists or 1-D integer arrays;
    an element that is not a non-negative 64-bit int raises TypeError."""
    n, chunk = 64, 1024
    local = np.zeros(n * chunk, np.uint8)
    engine.register(local)
    local[:] = pattern(9, local.size)
    seg = engine.open_segment(target.hello["peer_id"])
    remote = target.hello["addr"]
    order = np.arange(n, dtype=np.uint64)[::-1]  # reversed, strided view
    locals_ = local.ctypes.data + np.arange(n, dtype=np.uint64) * chunk
    remotes = remote + order * chunk
    engine.write_many(seg, locals_.astype(np.int64), remotes, np.full(n, chunk, np.uint32))
    expected = local.reshape(n, chunk)[::-1].reshape(-1)
    assert target.request("sha", length=n * chunk)["sha"] == sha(expected)

    back = np.zeros_like(local)
    engine.register(back)
    with engine.read_async(seg, [back.ctypes.data + i * chunk for i in range(n)],
                           remotes.tolist(), [chunk] * n) as batch:
        batch.wait(60)
    assert np.array_equal(back, local)

    base = local.ctypes.data
    for bad, what in (([base, 1.5], r"\[1\] is not an integer \(float\)"),
                      ([base, -1], r"\[1\] is negative"),
                      ([base, 2**64], r"\[1\] is negative or does not fit in 64 bits"),
                      ([base, -2**70], r"\[1\] is negative or does not fit in 64 bits"),
                      ([base, np.int64(-3)], r"\[1\] is negative or does not fit"),
                      ([base, "x"], r"\[1\] is not an integer \(str\)"),
                      (np.array([base, base], np.float64), "1-D integer array"),
                      (np.array([-1, 1], np.int64), r"\[0\] is negative")):
        with pytest.raises(TypeError, match=what):
            engine.write_many(seg, [base, base], bad, [1, 1])
        with pytest.raises(TypeError, match=what):
            engine.write_async(seg, [base, base], bad, [1, 1])
    with pytest.raises(ferry.InvalidArgument, match="differ in length"):
        engine.write_async(seg, [base], np.array([remote, remote], np.uint64), [1])
    engine._sweep_orphans()
    assert not engine._orphans  # the refused submits freed their batches


def test_transfer_errors(engine, target):
    local = np.zeros(4096, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    remote = target.hello["addr"]
    unregistered = np.zeros(4096, np.uint8)
    with pytest.raises(ferry.InvalidArgument, match="not inside a registered"):
        engine.write(seg, unregistered, remote)
    with pytest.raises(ferry.InvalidArgument, match="refused"):
        engine.write(seg, local, remote + SIZE - 1)
    with pytest.raises(ferry.InvalidArgument, match="refused"):
        engine.read(seg, local, 4096)
    with pytest.raises(ferry.InvalidArgument):
        engine.write(seg, local.ctypes.data, remote, 0)
    with pytest.raises(ferry.InvalidArgument, match="differ in length"):
        engine.write_many(seg, [local.ctypes.data], [remote, remote], [1])
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        engine.read(seg, b"x" * 10, remote)
    with pytest.raises(ferry.InvalidArgument):
        engine.write(12345, local, remote)  # a made-up segment handle
    with pytest.raises(ferry.Unavailable):
        engine.open_segment(f"127.0.0.1:{free_port()}")
    with pytest.raises(ferry.InvalidArgument):
        engine.open_segment("no port here")
    with ferry.Engine() as other:
        with pytest.raises(ferry.InvalidArgument, match="another engine"):
            other.write(seg, local, remote)
    seg.close()
    with pytest.raises(ferry.InvalidArgument):
        engine.write(seg.handle, local, remote)
    engine.write(target.hello["peer_id"], local, remote)  # reopened by id


def test_notifications_arrive_after_the_data(engine, target):
    local = np.zeros(SIZE, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    for i in range(3):
        local[:] = pattern(10 + i, SIZE)
        batch = engine.write_async(seg, [local.ctypes.data + k * (1 << 20) for k in range(8)],
                                   [target.hello["addr"] + k * (1 << 20) for k in range(8)],
                                   [1 << 20] * 8)
        engine.notify(seg, f"done-{i}", f"round {i}")  # without waiting for the batch
        notes = target.request("notifies", count=1)["notes"]
        assert [(n["name"], n["msg"]) for n in notes] == [(f"done-{i}", f"round {i}")]
        assert notes[0]["sha"] == sha(local)
        batch.wait(60)
        batch.free()


def test_ten_threads_through_one_engine(engine, target):
    threads, rounds, chunk = 10, 20, 64 << 10
    local = np.zeros(threads * chunk, np.uint8)
    engine.register(local)
    seg = engine.open_segment(target.hello["peer_id"])
    remote = target.hello["addr"]
    errors = []

    def sender(k):
        try:
            mine = local[k * chunk:(k + 1) * chunk]
            for r in range(rounds):
                mine[:] = pattern(1000 * k + r, chunk)
                if r % 2:
                    engine.write(seg, mine, remote + k * chunk)
                else:
                    engine.write_async(seg, [mine.ctypes.data], [remote + k * chunk], [chunk]).wait(60)
                back = np.zeros(chunk, np.uint8)
                engine.register(back)
                engine.read(seg, back, remote + k * chunk)
                engine.unregister(back)
                assert np.array_equal(back, mine), f"thread {k} round {r}"
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=sender, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers)
    assert errors == []
    assert target.request("sha", length=local.size)["sha"] == sha(local)


def test_several_engines_in_one_process():
    engines = [ferry.Engine(), ferry.Engine(), ferry.Engine(transport="tcp")]
    try:
        bufs = [np.zeros(1 << 20, np.uint8) for _ in engines]
        addrs = [e.register(b) for e, b in zip(engines, bufs)]
        bufs[0][:] = pattern(7, bufs[0].size)
        # ring: 0 -> 1 -> 2 -> 0, alternately write and read
        engines[0].write(engines[1].peer_id, bufs[0], addrs[1])
        engines[2].read(engines[1].peer_id, bufs[2], addrs[1])
        bufs[2][:100] = 0
        engines[2].write(engines[0].peer_id, bufs[2], addrs[0])
        assert np.array_equal(bufs[1], pattern(7, bufs[1].size))
        assert np.array_equal(bufs[2][100:], bufs[1][100:]) and not bufs[0][:100].any()
        seg = engines[0].open_segment(engines[1].peer_id)
        assert seg.info().transport == "local"
        assert engines[2].open_segment(engines[1].peer_id).info().transport == "tcp"
    finally:
        for e in engines:
            e.close()


def test_local_only_region_is_hidden_from_peers_and_refused():
    with ferry.Engine() as owner, ferry.Engine(transport="tcp") as peer:
        shared, private = np.zeros(1 << 16, np.uint8), np.zeros(1 << 16, np.uint8)
        mine = np.zeros(1 << 16, np.uint8)
        shared_addr = owner.register(shared)
        private_addr = owner.register(private, exported=False)
        peer.register(mine)
        regions = [r.addr for r in peer.query_segment(owner.peer_id).regions]
        assert shared_addr in regions and private_addr not in regions
        mine[:] = pattern(3, mine.size)
        with pytest.raises(ferry.InvalidArgument, match="not exported"):
            peer.write(owner.peer_id, mine, private_addr)
        assert not private.any()
        peer.write(owner.peer_id, mine, shared_addr)
        assert np.array_equal(shared, mine)
        # The owner moves bytes out of its local-only region as usual.
        private[:] = pattern(4, private.size)
        dest = np.zeros(1 << 16, np.uint8)
        owner.write(peer.peer_id, private, peer.register(dest))
        assert np.array_equal(dest, private)


def test_blocking_calls_release_the_gil():
    """A thread blocked in a handshake must let this thread run. A silent peer,
    served here in Python, accepts the connection and closes it: the handshake
    then fails at once. Were the GIL held during the call, this thread could
    accept only after the handshake had timed out."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(60)
    peer = f"127.0.0.1:{server.getsockname()[1]}"
    outcome = {}
    with ferry.Engine(connect_timeout=10, handshake_timeout=10) as e:
        def opener():
            try:
                e.open_segment(peer)
            except ferry.FerryError as err:
                outcome["error"] = err

        t = threading.Thread(target=opener)
        t.start()
        conn, _ = server.accept()
        conn.close()
        t.join(60)
    server.close()
    assert isinstance(outcome.get("error"), ferry.FerryError)
    assert not isinstance(outcome["error"], ferry.DeadlineExceeded), outcome["error"]


def test_deadlines_when_the_peer_stalls(spawn):
    target = spawn("native", str(1 << 20))
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    with ferry.Engine(transfer_timeout=1.0) as e:
        buf = np.full(1 << 20, 7, np.uint8)
        e.register(buf)
        seg = e.open_segment(peer)
        e.write(seg, buf[:10], remote)  # connected
        target.pause()
        try:
            batch = e.write_async(seg, [buf.ctypes.data], [remote], [buf.size])
            with pytest.raises(ferry.DeadlineExceeded, match="still pending"):
                batch.wait(timeout=0.05)
            assert not batch.done()
            with pytest.raises(ferry.FailedPrecondition):
                batch.free()  # still in flight
            with pytest.raises(ferry.DeadlineExceeded):
                e.write(seg, buf, remote)
            with pytest.raises(ferry.DeadlineExceeded):
                batch.wait()  # the request's own deadline
            assert batch.status().state == ferry.TransferState.FAILED
            assert isinstance(batch.results()[0], ferry.DeadlineExceeded)
            batch.free()
        finally:
            target.resume()
        e.write(seg, buf, remote)
        assert target.request("sha")["sha"] == sha(buf)


def test_an_engine_dropped_without_close_is_closed():
    gc.disable()  # no cycle collector: dropping the last reference must be enough
    try:
        with ferry.Engine() as observer:
            e = ferry.Engine()
            e.register(np.zeros(4096, np.uint8))
            seg = e.open_segment(observer.peer_id)
            batch = e.write_async(seg, [e.register(np.ones(8, np.uint8))],
                                  [observer.register(np.zeros(8, np.uint8))], [8])
            batch.wait(60)
            peer = e.peer_id
            observer.open_segment(peer)
            del e, seg, batch
            with pytest.raises(ferry.FerryError):
                observer.query_segment(peer)  # nobody answers on its port any more
    finally:
        gc.enable()


def test_cuda_tensors_register_as_their_device_and_are_checked(engine):
    class FakeDevice:
        type = "cuda"
        index = 0

        def __str__(self):
            return "cuda:0"

    class FakeCudaTensor:  # what a torch.Tensor on a GPU looks like to ferry
        device = FakeDevice()
        nbytes = 4096

        def data_ptr(self):
            return 0x7000_0000_0000

    # Registered as cuda:0, where the driver says this is no GPU memory (or
    # there is no driver at all): refused, nothing registered.
    with pytest.raises((ferry.FailedPrecondition, ferry.InvalidArgument), match="cuda:0"):
        engine.register(FakeCudaTensor())
    assert engine.registered() == {}

    class OtherDevice:
        type = "mps"

    class MpsTensor(FakeCudaTensor):
        device = OtherDevice()

    with pytest.raises(ferry.Unimplemented, match="host and CUDA memory"):
        engine.register(MpsTensor())
