"""ferry.mooncake.TransferEngine as a drop-in for mooncake.engine.TransferEngine."""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import random
import sys
import time

import pytest

import ferry
import ferry.mooncake as mc
from conftest import child_env, free_port
from peer import pattern

SIZE = 4 << 20
# Managed buffers are carved from mmap'ed arenas: this is outside any of them.
UNREGISTERED = 0x1000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_engine(protocol="tcp") -> mc.TransferEngine:
    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0, e.last_error()
    return e


def settle(engine, batch_id, limit=120.0) -> int:
    """Polls transfer_check_status until the batch is no longer in progress
    (bounded: gives up, returning 0, after `limit` seconds)."""
    deadline = time.monotonic() + limit
    while (state := engine.transfer_check_status(batch_id)) == 0 and time.monotonic() < deadline:
        time.sleep(0.0005)
    return state


@pytest.fixture
def engine():
    e = new_engine()
    yield e
    e.close()


@pytest.fixture
def target(spawn):
    return spawn("mooncake", str(SIZE), "tcp")


# ---- Import and surface ---------------------------------------------------------------
def test_install_makes_mooncake_engine_importable():
    assert "mooncake" not in sys.modules
    on_disk = importlib.util.find_spec("mooncake") is not None  # the pip-installed package
    try:
        module = mc.install()
        from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

        import mooncake.engine

        assert TransferEngine is mc.TransferEngine and module is mooncake.engine
        assert TransferOpcode.Read == 0 and TransferOpcode.Write == 1
        assert mooncake.engine.Read == 0 and mooncake.engine.Write == 1
        assert TransferEngine.TransferOpcode is TransferOpcode
        assert importlib.metadata.version("mooncake-transfer-engine") == mc.MOONCAKE_VERSION
        assert mc.install() is module  # idempotent
        note = TransferNotify()
        assert (note.name, note.msg) == ("", "")
        note = TransferNotify("n", "m")
        note.msg = "changed"
        assert (note.name, note.msg) == ("n", "changed")
        engine = TransferEngine()
        assert hasattr(engine, "batch_transfer_sync_write") and hasattr(engine, "send_probe")
    finally:
        mc.uninstall()
    assert "mooncake" not in sys.modules
    if not on_disk:  # uninstall() took away the only mooncake there was
        with pytest.raises(ImportError):
            import mooncake.engine  # noqa: F401


# name -> parameters (with defaults) as the Mooncake reference lists them
SURFACE = {
    "initialize": "local_hostname, metadata_server, protocol, device_name",
    "initialize_ext": "local_hostname, metadata_server, protocol, device_name, metadata_type",
    "get_rpc_port": "",
    "register_memory": "buffer_addr, capacity, location='*'",
    "unregister_memory": "buffer_addr",
    "batch_register_memory": "buffer_addresses, capacities, location='*'",
    "batch_unregister_memory": "buffer_addresses",
    "transfer_sync_write": "target_hostname, buffer, peer_buffer_address, length, transport_hint=''",
    "transfer_sync_read": "target_hostname, buffer, peer_buffer_address, length, transport_hint=''",
    "transfer_sync": "target_hostname, buffer, peer_buffer_address, length, opcode, notify=None, "
                     "transport_hint=''",
    "batch_transfer_sync_write": "target_hostname, buffers, peer_buffer_addresses, lengths, "
                                 "transport_hint=''",
    "batch_transfer_sync_read": "target_hostname, buffers, peer_buffer_addresses, lengths, "
                                "transport_hint=''",
    "batch_transfer_sync": "target_hostname, buffers, peer_buffer_addresses, lengths, opcode, "
                           "notify=None, transport_hint=''",
    "batch_transfer_async_write": "target_hostname, buffers, peer_buffer_addresses, lengths, "
                                  "transport_hint=''",
    "batch_transfer_async_read": "target_hostname, buffers, peer_buffer_addresses, lengths, "
                                 "transport_hint=''",
    "batch_transfer_async": "target_hostname, buffers, peer_buffer_addresses, lengths, opcode, "
                            "transport_hint=''",
    "get_batch_transfer_status": "batch_ids",
    "transfer_submit_write": "target_hostname, buffer, peer_buffer_address, length, "
                             "transport_hint=''",
    "transfer_check_status": "batch_id",
    "allocate_managed_buffer": "length",
    "free_managed_buffer": "buffer_addr, length",
    "write_bytes_to_buffer": "dest_address, src_bytes, length",
    "read_bytes_from_buffer": "source_address, length",
    "get_first_buffer_address": "segment_name",
    "get_local_topology": "device_name=None",
    "get_notifies": "",
    "send_probe": "peer_server_name",
    "get_engine": "",
    "get_engine_ptr": "",
    "warmup_efa_segment": "segment_name",
    "transfer_write_on_cuda": "target_hostname, buffer, peer_buffer_address, length, "
                              "stream_ptr=0, transport_hint=''",
    "transfer_read_on_cuda": "target_hostname, buffer, peer_buffer_address, length, "
                             "stream_ptr=0, transport_hint=''",
    "batch_transfer_write_on_cuda": "target_hostname, buffers, peer_buffer_addresses, lengths, "
                                    "stream_ptr=0, transport_hint=''",
    "batch_transfer_read_on_cuda": "target_hostname, buffers, peer_buffer_addresses, lengths, "
                                   "stream_ptr=0, transport_hint=''",
}
# Ferry's additions to the class (documented in the module docstring).
FERRY_EXTRAS = {"close", "last_error", "ferry_options"}
# mooncake.engine's module attributes in a CUDA build of Mooncake 0.3.12.post1, less
# what is out of scope (RpcInterface, CoroRPCInterface, ReceivedData, ReceivedTensor,
# their factory functions, SharedSegment).
MODULE_SURFACE = {"TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write",
                  "InnerTransferEngine", "SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP",
                  "SUPPORT_MNNVL", "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK"}


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_method_signatures(name):
    params = list(inspect.signature(getattr(mc.TransferEngine, name)).parameters.values())[1:]
    text = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                     for p in params)
    assert text == SURFACE[name]


def test_the_class_has_mooncakes_methods_and_only_ferrys_few_extras():
    public = {n for n in dir(mc.TransferEngine) if not n.startswith("_")} - {"TransferOpcode"}
    public |= {n for n in vars(mc.TransferEngine()) if not n.startswith("_")}
    assert public == set(SURFACE) | FERRY_EXTRAS


def test_the_module_surface_and_its_build_flags():
    try:
        module = mc.install()
        assert MODULE_SURFACE <= set(vars(module))
        # Ferry's CUDA path is always built (the driver is loaded at run time); the
        # rest are transports and allocators Ferry does not have.
        flags = {n: getattr(module, n) for n in MODULE_SURFACE if n.startswith("SUPPORT_")}
        assert flags == {"SUPPORT_CUDA": True, "SUPPORT_EFA": False, "SUPPORT_HIP": False,
                         "SUPPORT_MNNVL": False, "SUPPORT_MUSA": False,
                         "SUPPORT_INTRA_NVLINK": False}
        assert all(type(v) is bool for v in flags.values())
        assert module.InnerTransferEngine is ferry.Engine
    finally:
        mc.uninstall()


def test_get_engine_ptr_is_a_stable_nonzero_handle_of_the_engine():
    e = mc.TransferEngine()
    assert e.get_engine_ptr() == 0  # not initialized: Mooncake's null pointer
    e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    other = new_engine()
    try:
        ptr = e.get_engine_ptr()
        assert isinstance(ptr, int) and ptr != 0
        assert all(e.get_engine_ptr() == ptr for _ in range(3))
        assert other.get_engine_ptr() not in (0, ptr)
        assert isinstance(e.get_engine(), mc.InnerTransferEngine)
    finally:
        e.close()
        other.close()
    assert e.get_engine_ptr() == 0


def test_warmup_efa_segment_opens_the_peer(engine):
    peer = new_engine()
    try:
        name = f"127.0.0.1:{peer.get_rpc_port()}"
        assert name not in engine._segments
        assert engine.warmup_efa_segment(name) == 0
        assert name in engine._segments  # opened once, reused by the transfers
        assert engine.warmup_efa_segment(segment_name=name) == 0
    finally:
        peer.close()
    port = free_port()
    assert engine.warmup_efa_segment(f"127.0.0.1:{port}") == -1
    assert engine.last_error().startswith("warmup_efa_segment: UNAVAILABLE")
    assert str(port) in engine.last_error()


@pytest.mark.parametrize("hint", ["", "tcp", "rdma", "nvlink", "unspec", "no-such-transport"])
def test_transport_hint_is_accepted_and_changes_nothing(engine, hint):
    """As in Mooncake's CUDA wheel (no TENT) a hint is ignored: every method that
    takes one moves the same bytes over the transport Ferry chose for the peer."""
    peer = new_engine()
    try:
        name = f"127.0.0.1:{peer.get_rpc_port()}"
        src = pattern(7, 4096)
        dst = peer.allocate_managed_buffer(4096)
        local = engine.allocate_managed_buffer(4096)
        engine.write_bytes_to_buffer(local, src.tobytes(), 4096)
        assert engine.transfer_sync_write(name, local, dst, 1024, transport_hint=hint) == 0
        assert engine.batch_transfer_sync_write(name, [local + 1024], [dst + 1024], [1024],
                                                hint) == 0
        assert engine.transfer_sync(name, local + 2048, dst + 2048, 512, mc.Write, None,
                                    hint) == 0
        batch = engine.batch_transfer_async_write(name, [local + 2560], [dst + 2560], [512], hint)
        assert batch != 0 and engine.get_batch_transfer_status([batch]) == 0
        batch = engine.transfer_submit_write(name, local + 3072, dst + 3072, 1024, hint)
        assert batch != 0 and settle(engine, batch) == 1
        assert peer.read_bytes_from_buffer(dst, 4096) == src.tobytes()
        assert engine._segments[name].info().transport == "tcp"  # protocol "tcp", hint or not
        back = engine.allocate_managed_buffer(4096)
        assert engine.transfer_sync_read(name, back, dst, 4096, transport_hint=hint) == 0
        assert engine.read_bytes_from_buffer(back, 4096) == src.tobytes()
    finally:
        peer.close()


# ---- initialize and the environment -------------------------------------------------------
def test_initialize_rdma_without_rdma_runs_over_tcp_or_local():
    e = new_engine("rdma")
    try:
        assert e.get_rpc_port() > 0
        assert e.get_engine().options["transport"] == "auto"
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == -1  # twice
        assert "already initialized" in e.last_error()
    finally:
        e.close()


@pytest.mark.parametrize("form", ["etcd://127.0.0.1:{port}", "127.0.0.1:{port}", "redis://127.0.0.1:{port}"])
def test_an_unreachable_metadata_service_fails_initialize_with_the_reason(form):
    e = mc.TransferEngine()
    port = free_port()  # nothing listens there
    assert e.initialize("127.0.0.1", form.format(port=port), "tcp", "") == -1
    assert "UNAVAILABLE" in e.last_error() and f"127.0.0.1:{port}" in e.last_error()
    assert e.get_rpc_port() == -1
    # initialize_ext's metadata_type names the scheme of a bare HOST:PORT.
    assert e.initialize_ext("127.0.0.1", f"127.0.0.1:{port}", "tcp", "", "redis") == -1
    assert f"redis://127.0.0.1:{port}" in e.last_error()


def test_an_unreachable_http_metadata_server_fails_initialize_with_the_reason():
    e = mc.TransferEngine()
    port = free_port()  # nothing listens there
    assert e.initialize("127.0.0.1", f"http://127.0.0.1:{port}/metadata", "tcp", "") == -1
    assert "UNAVAILABLE" in e.last_error() and f"127.0.0.1:{port}" in e.last_error()
    assert e.get_rpc_port() == -1


def test_bad_initialize_arguments():
    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "") == -1
    assert "protocol" in e.last_error()
    assert e.initialize("", "P2PHANDSHAKE", "tcp", "") == -1
    assert "local_hostname" in e.last_error()


def test_calls_before_initialize_fail_with_a_reason():
    e = mc.TransferEngine()
    assert e.register_memory(0x1000, 16) < 0
    assert "not initialized" in e.last_error()
    assert e.transfer_sync_write("127.0.0.1:1", 0x1000, 0x2000, 16) == -1
    assert e.batch_transfer_async_write("127.0.0.1:1", [0x1000], [0x2000], [16]) == 0
    assert e.allocate_managed_buffer(16) == 0
    assert e.get_notifies() == []


def test_environment_is_read_at_initialize(monkeypatch):
    monkeypatch.setenv("MC_FORCE_TCP", "False")  # presence means on
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "2")  # below the minimum of 5
    port = free_port()
    monkeypatch.setenv("MC_HANDSHAKE_PORT", str(port))
    monkeypatch.setenv("MC_LOG_LEVEL", "ERROR")
    e = new_engine("rdma")
    try:
        opts = e.get_engine().options
        assert opts["transport"] == "tcp" and opts["transfer_timeout"] == 5.0
        assert e.get_rpc_port() == port
        assert logging.getLogger("ferry.mooncake").level == logging.ERROR
    finally:
        e.close()
        logging.getLogger("ferry.mooncake").setLevel(logging.NOTSET)
    monkeypatch.delenv("MC_FORCE_TCP")
    monkeypatch.delenv("MC_HANDSHAKE_PORT")
    monkeypatch.delenv("MC_LOG_LEVEL")
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "12.5")
    monkeypatch.setenv("MC_MIN_RPC_PORT", "20000")
    monkeypatch.setenv("MC_MAX_RPC_PORT", "20999")
    e = new_engine("rdma")
    try:
        opts = e.get_engine().options
        assert opts["transport"] == "auto" and opts["transfer_timeout"] == 12.5
        assert 20000 <= e.get_rpc_port() <= 20999
    finally:
        e.close()


# ---- Memory ---------------------------------------------------------------------------
def test_register_memory_return_codes(engine):
    buf = engine.allocate_managed_buffer(1)  # a pool and one registered buffer exist
    assert buf != 0
    data = bytearray(1 << 16)
    addr = ferry._ferry.buffer_address(data)[0]
    assert engine.register_memory(addr, 0) == -1
    assert "zero-length" in engine.last_error()
    assert engine.register_memory(addr, len(data)) == 0
    assert engine.register_memory(addr + 100, 100) == -7
    assert "overlaps" in engine.last_error()
    assert engine.unregister_memory(addr + 1) == -3
    assert engine.unregister_memory(addr) == 0
    assert engine.unregister_memory(addr) == -3
    assert engine.batch_register_memory([addr, addr + 4096], [4096]) == -1
    assert engine.batch_register_memory([addr, addr + 4096], [4096, 4096], "cpu:0") == 0
    assert engine.batch_register_memory([addr + 8192, addr + 4096], [4096, 4096]) == -7
    assert engine.batch_unregister_memory([addr, addr + 4096]) == 0
    assert engine.batch_unregister_memory([addr]) == -3


def test_managed_buffers(engine):
    a = engine.allocate_managed_buffer(1000)
    b = engine.allocate_managed_buffer(5000)
    assert a and b and a != b and abs(b - a) >= 1000
    payload = bytes(range(256)) * 4
    assert engine.write_bytes_to_buffer(a, payload, 1000) == 0
    assert engine.read_bytes_from_buffer(a, 1000) == payload[:1000]
    assert engine.write_bytes_to_buffer(a, b"short", 10) == -1
    assert "exceeds" in engine.last_error()
    # each buffer is a region of its own, exactly as long as asked for
    assert engine.get_engine().registered() == {a: 1000, b: 5000}
    assert engine.free_managed_buffer(a, 1000) == 0
    assert engine.free_managed_buffer(a, 1000) == -3  # twice: NOT_FOUND
    assert "not a managed buffer" in engine.last_error()
    assert engine.free_managed_buffer(0x1000, 16) == -3
    assert engine.get_engine().registered() == {b: 5000}
    assert engine.free_managed_buffer(b, 5000) == 0
    assert engine.get_engine().registered() == {}
    assert engine.allocate_managed_buffer(1000) == a  # the space is reused
    big = engine.allocate_managed_buffer(300 << 20)  # larger than an arena: a new one
    assert big and engine.write_bytes_to_buffer(big + (300 << 20) - 3, b"end", 3) == 0
    assert engine.allocate_managed_buffer(0) == 0
    regions = engine.get_engine().query_segment(engine.get_engine().peer_id).regions
    assert sorted((r.addr, r.length) for r in regions) == sorted([(a, 1000), (big, 300 << 20)])


def test_managed_buffers_from_many_threads(engine):
    import threading

    errors = []

    def churn(seed):
        rng = random.Random(seed)
        try:
            for _ in range(200):
                n = rng.randint(1, 1 << 16)
                addr = engine.allocate_managed_buffer(n)
                assert addr, engine.last_error()
                assert engine.get_engine().registered().get(addr) == n
                assert engine.free_managed_buffer(addr, n) == 0, engine.last_error()
        except AssertionError as e:
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert engine.get_engine().registered() == {}


# ---- Peers reach the managed buffers handed out, nothing else of the pool -----------------
MANAGED = 64 << 20
PADDING = 100  # the first buffer is this much short of the pool's 256-byte steps


class InProcessTarget:
    """A TransferEngine of this process as the target (local or tcp transport)."""

    def __init__(self, protocol):
        self.engine = new_engine(protocol)
        self.peer_id = f"127.0.0.1:{self.engine.get_rpc_port()}"

    def allocate(self, length):
        addr = self.engine.allocate_managed_buffer(length)
        assert addr, self.engine.last_error()
        return addr

    def free(self, addr, length):
        return self.engine.free_managed_buffer(addr, length)

    def peek(self, addr, length):
        return ctypes.string_at(addr, length)

    def poke(self, addr, data):
        ctypes.memmove(addr, data, len(data))

    def close(self):
        self.engine.close()


class ProcessTarget:
    """peer.py's mooncake target in another process (tcp, or shm for "rdma")."""

    def __init__(self, spawn, protocol):
        self.peer = spawn("mooncake", "4096", protocol)
        self.peer_id = self.peer.hello["peer_id"]

    def allocate(self, length):
        return self.peer.request("allocate", length=length)["addr"]

    def free(self, addr, length):
        return self.peer.request("free", addr=addr, length=length)["rc"]

    def peek(self, addr, length):
        return bytes.fromhex(self.peer.request("peek", addr=addr, length=length)["hex"])

    def poke(self, addr, data):
        self.peer.request("poke", addr=addr, hex=data.hex())

    def close(self):
        pass  # spawn stops it


@pytest.fixture(params=["local", "in-process-tcp", "process-tcp", "process-auto"])
def pool_target(request, spawn):
    """(target, initiator): a target whose managed buffers the initiator (a
    TransferEngine of this process) transfers to and from, over the transport
    the name says ("auto": shm, or tcp where this host refuses same-host copies)."""
    from conftest import same_host_copy_refusal

    kind = request.param
    protocol = "tcp" if kind.endswith("tcp") else "rdma"
    target = (ProcessTarget(spawn, protocol) if kind.startswith("process")
              else InProcessTarget(protocol))
    initiator = new_engine(protocol)
    try:
        segment = initiator.get_engine().open_segment(target.peer_id)
        expected = {"local": "local", "process-auto": "tcp" if same_host_copy_refusal() else "shm"}
        assert segment.info().transport == expected.get(kind, "tcp")
        yield target, initiator
    finally:
        initiator.close()
        target.close()


def assert_refused(initiator, transfer, what):
    assert transfer() == -1, f"{what}: accepted"
    error = initiator.last_error()
    assert "refused" in error and "not inside a registered memory region" in error, (what, error)


def test_peers_reach_only_the_managed_buffers_handed_out(pool_target):
    target, initiator = pool_target
    peer = target.peer_id
    length_a = MANAGED - PADDING
    a = target.allocate(length_a)
    b = target.allocate(MANAGED)
    assert b == a + MANAGED  # back to back in one arena: a, its padding, b, free space
    end_a, end_b = a + length_a, b + MANAGED

    src = initiator.allocate_managed_buffer(1 << 16)
    dst = initiator.allocate_managed_buffer(1 << 16)
    junk = pattern(5, 1 << 16).tobytes()
    initiator.write_bytes_to_buffer(src, junk, len(junk))
    initiator.write_bytes_to_buffer(dst, bytes(1 << 16), 1 << 16)

    # Known bytes around a's end (inside a, its padding, b's start) and b's end
    # (inside b, free space of the arena): no refused transfer may change them.
    watched = {end_a - 4096: 4096 + PADDING + 4096, end_b - 4096: 4096 + 8192}
    marks = {addr: pattern(addr % 1000, n).tobytes() for addr, n in watched.items()}
    for addr, data in marks.items():
        target.poke(addr, data)

    def unchanged():
        for addr, data in marks.items():
            assert target.peek(addr, len(data)) == data, f"{addr - a:#x}: changed"

    def write(remote, length):
        return lambda: initiator.transfer_sync_write(peer, src, remote, length)

    # (1) starting past a's end: in its padding, and in the free space after b
    assert_refused(initiator, write(end_a, 16), "padding after a")
    assert_refused(initiator, write(end_a, PADDING), "all of a's padding")
    assert_refused(initiator, write(end_a + PADDING - 8, 16), "padding into b")
    assert_refused(initiator, write(end_b, 16), "free space after b")
    assert_refused(initiator, write(end_b + 4096, 4096), "deeper in the free space")
    assert_refused(initiator, write(a + (128 << 20) + (64 << 20), 1 << 16), "far in the arena")
    # (2) straddling a buffer's end: nothing of it is written, inside the buffer either
    assert_refused(initiator, write(end_a - 8, 16), "straddles a's end")
    assert_refused(initiator, write(end_a - 4096, 4096 + PADDING + 4096), "a over padding into b")
    assert_refused(initiator, write(end_b - 4096, 8192), "straddles b's end")
    assert_refused(initiator, lambda: initiator.batch_transfer_sync_write(
        peer, [src], [end_a - 1], [2]), "one byte past a, in a batch")
    batch = initiator.batch_transfer_async_write(peer, [src], [end_b - 100], [200])
    assert batch != 0 and initiator.get_batch_transfer_status([batch]) == -1
    # reads are bounded the same way
    assert_refused(initiator, lambda: initiator.transfer_sync_read(peer, dst, end_a - 8, 16),
                   "read straddling a's end")
    assert_refused(initiator, lambda: initiator.transfer_sync_read(peer, dst, end_b, 16),
                   "read of free space")
    assert initiator.read_bytes_from_buffer(dst, 1 << 16) == bytes(1 << 16)
    unchanged()

    # (3) fully inside a buffer still works, up to its last byte
    assert initiator.transfer_sync_write(peer, src, end_a - 16, 16) == 0, initiator.last_error()
    assert initiator.transfer_sync_write(peer, src + 16, a, 32) == 0, initiator.last_error()
    assert initiator.transfer_sync_write(peer, src + 64, end_b - 4096, 4096) == 0
    assert target.peek(end_a - 16, 16) == junk[:16]
    assert target.peek(a, 32) == junk[16:48]
    assert target.peek(end_b - 4096, 4096) == junk[64:64 + 4096]
    assert target.peek(end_a, PADDING + 4096) == marks[end_a - 4096][4096:]
    assert target.peek(end_b, 8192) == marks[end_b - 4096][4096:]
    assert initiator.transfer_sync_read(peer, dst, end_a - 16, 16) == 0
    assert initiator.read_bytes_from_buffer(dst, 16) == junk[:16]

    # (4) a freed buffer is unreachable; the other one still works
    for addr, data in marks.items():
        target.poke(addr, data)
    assert target.free(a, length_a) == 0
    assert_refused(initiator, write(a, 16), "start of freed a")
    assert_refused(initiator, write(end_a - 4096, 4096), "end of freed a")
    unchanged()
    assert initiator.transfer_sync_write(peer, src, b, 16) == 0, initiator.last_error()
    assert target.peek(b, 16) == junk[:16]
    assert target.free(b, MANAGED) == 0
    assert_refused(initiator, write(b, 16), "freed b")
    # the space is handed out again: reachable again, exactly as long as asked for
    c = target.allocate(100)
    assert c == a
    assert initiator.transfer_sync_write(peer, src, c, 100) == 0, initiator.last_error()
    assert_refused(initiator, write(c + 96, 8), "past the new, shorter buffer")
    assert target.peek(c, 100) == junk[:100]


def test_get_local_topology(engine):
    topology = json.loads(engine.get_local_topology())
    assert topology and all(k.startswith("cpu:") for k in topology)


# ---- Transfers ---------------------------------------------------------------------------
def test_thousand_rounds_of_random_writes_and_reads(engine, target):
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    assert engine.get_first_buffer_address(peer) == remote
    src = engine.allocate_managed_buffer(SIZE)
    dst = engine.allocate_managed_buffer(SIZE)
    rng = random.Random(1)
    mirror = bytearray(SIZE)  # what the target's buffer must hold
    for round_ in range(1000):
        length = rng.choice([1, 7, 4096, rng.randint(1, 1 << 16), rng.randint(1, SIZE // 4)])
        offset = rng.randint(0, SIZE - length)
        data = rng.randbytes(length)
        assert engine.write_bytes_to_buffer(src, data, length) == 0
        assert engine.transfer_sync_write(peer, src, remote + offset, length) == 0, engine.last_error()
        mirror[offset:offset + length] = data
        assert engine.transfer_sync_read(peer, dst, remote + offset, length) == 0, engine.last_error()
        assert engine.read_bytes_from_buffer(dst, length) == data, f"round {round_}"
    assert target.request("sha")["sha"] == sha(bytes(mirror))


def test_batches_of_100_entries(engine, target):
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    n, chunk = 100, 8192
    src = engine.allocate_managed_buffer(n * chunk)
    dst = engine.allocate_managed_buffer(n * chunk)
    data = pattern(3, n * chunk).tobytes()
    engine.write_bytes_to_buffer(src, data, len(data))
    srcs = [src + i * chunk for i in range(n)]
    dsts = [dst + i * chunk for i in range(n)]
    remotes = [remote + 2 * i * chunk for i in range(n)]  # every other chunk
    lengths = [chunk] * n

    def expected_remote(blob):
        out = bytearray(2 * n * chunk)
        for i in range(n):
            out[2 * i * chunk:(2 * i + 1) * chunk] = blob[i * chunk:(i + 1) * chunk]
        return bytes(out)

    assert engine.batch_transfer_sync_write(peer, srcs, remotes, lengths) == 0
    assert target.request("sha", length=2 * n * chunk)["sha"] == sha(expected_remote(data))
    assert engine.batch_transfer_sync_read(peer, dsts, remotes, lengths) == 0
    assert engine.read_bytes_from_buffer(dst, n * chunk) == data
    assert engine.batch_transfer_sync_write(peer, srcs, remotes, lengths[:-1]) == -1
    assert "lengths" in engine.last_error()
    assert engine.batch_transfer_sync_write(peer, [], [], []) == 0

    data = pattern(4, n * chunk).tobytes()
    engine.write_bytes_to_buffer(src, data, len(data))
    ids = [engine.batch_transfer_async_write(peer, srcs[:50], remotes[:50], lengths[:50]),
           engine.batch_transfer_async(peer, srcs[50:], remotes[50:], lengths[50:],
                                       mc.TransferOpcode.Write)]
    assert all(ids) and ids[0] != ids[1]
    assert engine.get_batch_transfer_status(ids) == 0
    assert engine.get_batch_transfer_status(ids) == -1  # already collected
    assert target.request("sha", length=2 * n * chunk)["sha"] == sha(expected_remote(data))
    engine.write_bytes_to_buffer(dst, bytes(n * chunk), n * chunk)
    ids = [engine.batch_transfer_async_read(peer, dsts, remotes, lengths),
           engine.batch_transfer_async(peer, [dst], [remote], [10], 0)]
    assert engine.get_batch_transfer_status(ids) == 0
    assert engine.read_bytes_from_buffer(dst + 10, n * chunk - 10) == data[10:]
    assert engine.read_bytes_from_buffer(dst, 10) == expected_remote(data)[:10]

    # one-at-a-time submission with polling
    batch_id = engine.transfer_submit_write(peer, src, remote, 4096)
    assert batch_id != 0
    assert settle(engine, batch_id) == 1
    assert engine.transfer_check_status(batch_id) == -1  # freed when it completed
    bad = engine.transfer_submit_write(peer, src, UNREGISTERED, 4096)
    assert bad != 0
    assert settle(engine, bad) == -1 and "refused" in engine.last_error()
    bad = engine.batch_transfer_async_write(peer, [src, src], [remote, UNREGISTERED], [8, 8])
    assert engine.get_batch_transfer_status([bad]) == -1
    assert "request 1" in engine.last_error()


def test_transfer_failures_return_minus_one_with_reason(engine, target):
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    src = engine.allocate_managed_buffer(4096)
    assert engine.transfer_sync_write(peer, src, UNREGISTERED, 4096) == -1
    assert "refused" in engine.last_error()
    assert engine.transfer_sync_read(peer, 0x1234, remote, 16) == -1
    assert "registered" in engine.last_error()
    assert engine.transfer_sync(peer, src, remote, 16, 7) == -1
    assert "opcode" in engine.last_error()
    assert engine.transfer_sync_write("no-port", src, remote, 16) == -1
    assert "host:rpc_port" in engine.last_error()
    assert engine.transfer_sync_write("127.0.0.1:notaport", src, remote, 16) == -1


def test_async_calls_to_an_unknown_peer_return_zero(engine):
    src = engine.allocate_managed_buffer(4096)
    dead = f"127.0.0.1:{free_port()}"
    assert engine.batch_transfer_async_write(dead, [src], [0x1000], [16]) == 0
    assert "UNAVAILABLE" in engine.last_error()
    assert engine.batch_transfer_async_read(dead, [src], [0x1000], [16]) == 0
    assert engine.batch_transfer_async(dead, [src], [0x1000], [16], mc.TransferOpcode.Read) == 0
    assert engine.transfer_submit_write(dead, src, 0x1000, 16) == 0
    assert engine.transfer_sync_write(dead, src, 0x1000, 16) == -1
    assert engine.get_first_buffer_address(dead) == 0


def test_send_probe(engine, spawn):
    target = spawn("mooncake", "4096", "tcp")
    peer = target.hello["peer_id"]
    assert engine.send_probe(peer) == 0
    assert engine.send_probe(f"127.0.0.1:{free_port()}") < 0
    target.kill()
    assert engine.send_probe(peer) != 0  # the cached segment's peer is gone
    assert engine.last_error().startswith("send_probe")


def test_notifications_arrive_after_the_data(engine, target):
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    src = engine.allocate_managed_buffer(SIZE)
    for i in range(3):
        data = pattern(20 + i, SIZE).tobytes()
        engine.write_bytes_to_buffer(src, data, SIZE)
        note = mc.TransferNotify(f"kv-{i}", json.dumps({"round": i}))
        if i == 0:
            assert engine.transfer_sync(peer, src, remote, SIZE, mc.Write, note) == 0
        else:
            half = SIZE // 2
            assert engine.batch_transfer_sync(peer, [src, src + half], [remote, remote + half],
                                              [half, half], mc.TransferOpcode.Write, notify=note) == 0
        notes = target.request("notifies", count=1)["notes"]
        assert [(n["name"], json.loads(n["msg"])) for n in notes] == [(f"kv-{i}", {"round": i})]
        assert notes[0]["sha"] == sha(data)


def test_notifications_between_two_local_engines(engine):
    other = new_engine()
    try:
        dst = other.allocate_managed_buffer(64)
        src = engine.allocate_managed_buffer(64)
        engine.write_bytes_to_buffer(src, b"x" * 64, 64)
        peer = f"127.0.0.1:{other.get_rpc_port()}"
        assert engine.transfer_sync(peer, src, dst, 64, mc.Write, mc.TransferNotify("a", "é")) == 0
        notes = other.get_notifies()
        assert notes == [mc.TransferNotify("a", "é")]
        assert other.read_bytes_from_buffer(dst, 64) == b"x" * 64
        assert other.get_notifies() == []  # drained
    finally:
        other.close()


def test_each_failure_is_logged_once(engine, caplog):
    with caplog.at_level(logging.ERROR, logger="ferry.mooncake"):
        assert engine.unregister_memory(0x1000) == -3
    records = [r for r in caplog.records if r.name == "ferry.mooncake"]
    assert len(records) == 1
    assert records[0].getMessage() == engine.last_error()
    assert engine.last_error().startswith("unregister_memory: NOT_FOUND")


def test_last_error_is_per_thread(engine):
    import threading

    assert engine.unregister_memory(0x1000) == -3
    seen = {}

    def other():
        assert engine.register_memory(0x2000, 0) == -1
        seen["other"] = engine.last_error()

    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    assert "unregister_memory" in engine.last_error()
    assert "register_memory" in seen["other"] and "unregister" not in seen["other"]


def test_mooncake_code_mapping():
    def code(cls):
        return mc.mooncake_code(cls("x"))

    assert code(ferry.InvalidArgument) == -1
    assert code(ferry.NotFound) == -3
    assert code(ferry.AlreadyExists) == -7
    assert code(ferry.Unavailable) < 0 and code(ferry.Internal) < 0


def test_check_status_reports_a_timeout(spawn, monkeypatch):
    target = spawn("mooncake", "4096", "tcp")
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "5")  # the minimum
    engine = new_engine()
    try:
        src = engine.allocate_managed_buffer(4096)
        assert engine.transfer_sync_write(peer, src, remote, 4096) == 0
        target.pause()
        try:
            batch_id = engine.transfer_submit_write(peer, src, remote, 4096)
            assert batch_id != 0 and engine.transfer_check_status(batch_id) == 0
            slow = engine.batch_transfer_async_write(peer, [src], [remote], [4096])
            assert settle(engine, batch_id) == -2 and "DEADLINE_EXCEEDED" in engine.last_error()
            assert engine.get_batch_transfer_status([slow]) == -1
        finally:
            target.resume()
        assert engine.transfer_sync_write(peer, src, remote, 4096) == 0
    finally:
        engine.close()


def test_a_restarted_peer_under_the_same_session_id(engine, spawn):
    port = free_port()
    first = spawn("mooncake", "4096", "tcp", env=child_env(MC_HANDSHAKE_PORT=str(port)))
    session = first.hello["peer_id"]
    assert session == f"127.0.0.1:{port}"
    src = engine.allocate_managed_buffer(4096)
    engine.write_bytes_to_buffer(src, b"a" * 4096, 4096)
    assert engine.transfer_sync_write(session, src, first.hello["addr"], 4096) == 0
    first.kill()
    assert engine.transfer_sync_write(session, src, first.hello["addr"], 4096) == -1
    assert "UNAVAILABLE" in engine.last_error()
    second = spawn("mooncake", "4096", "tcp", env=child_env(MC_HANDSHAKE_PORT=str(port)))
    assert second.hello["peer_id"] == session
    assert engine.transfer_sync_write(session, src, second.hello["addr"], 4096) == 0, \
        engine.last_error()
    assert second.request("sha")["sha"] == sha(b"a" * 4096)


def test_lists_may_be_tuples_or_numpy_arrays(engine, target):
    import numpy as np

    peer, remote = target.hello["peer_id"], target.hello["addr"]
    src = engine.allocate_managed_buffer(64)
    engine.write_bytes_to_buffer(src, bytes(range(64)), 64)
    assert engine.batch_transfer_sync_write(
        peer, np.array([src, src + 32], dtype=np.uint64), np.array([remote + 32, remote]),
        np.array([32, 32])) == 0, engine.last_error()
    assert engine.batch_transfer_sync_write(peer, (src,), (remote + 64,), (8,)) == 0
    assert engine.transfer_sync_write(peer, np.uint64(src), np.int64(remote + 72), np.int32(8)) == 0
    want = bytes(range(32, 64)) + bytes(range(32)) + bytes(range(8)) * 2
    assert target.request("sha", length=80)["sha"] == sha(want)


def test_get_batch_transfer_status_names_every_failure(engine, target):
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    src = engine.allocate_managed_buffer(64)
    good = engine.batch_transfer_async_write(peer, [src], [remote], [8])
    bad = [engine.batch_transfer_async_write(peer, [src], [UNREGISTERED], [8]) for _ in range(2)]
    assert engine.get_batch_transfer_status([good, *bad, 424242]) == -1
    assert "3 of 4 batches failed" in engine.last_error()


@pytest.mark.parametrize("given, peer_id", [
    ("127.0.0.1:15001", "127.0.0.1:15001"),
    ("localhost:15001", "127.0.0.1:15001"),
    ("[::1]:15001", "[::1]:15001"),
    ("[0:0::1]:15001", "[::1]:15001"),
])
def test_session_ids(given, peer_id):
    assert mc._peer_id(given) == peer_id


@pytest.mark.parametrize("bad", ["127.0.0.1", "127.0.0.1:", "127.0.0.1:x", "[::1", "::1"])
def test_bad_session_ids(bad):
    with pytest.raises(ferry.InvalidArgument):
        mc._peer_id(bad)


def test_a_dropped_transfer_engine_is_closed(engine):
    import gc

    gc.disable()
    try:
        other = new_engine()
        other.allocate_managed_buffer(64)
        peer = f"127.0.0.1:{other.get_rpc_port()}"
        assert engine.send_probe(peer) == 0
        del other
        assert engine.send_probe(peer) != 0
    finally:
        gc.enable()
