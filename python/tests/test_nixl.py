"""The nixl drop-in (python/nixl) in the call orders of vLLM's NixlConnector and
SGLang's nixl backend, against NIXL agents in other processes (nixl_peer.py),
plus its error conventions. Every byte moved is verified."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import TESTS, child_env, free_port
from peer import pattern

import nixl  # noqa: E402  (from the build tree, next to ferry)
import nixl._bindings as nixlBind
from nixl._api import nixl_agent, nixl_agent_config
from nixl._bindings import (NIXL_INIT_AGENT, nixlBackendError, nixlInvalidParamError,
                            nixlNoTelemetryError, nixlNotFoundError, nixlNotSupportedError,
                            nixlRemoteDisconnectError, nixlRepostActiveError, nixlXferTelemetry)

PEER = TESTS / "nixl_peer.py"
BLOCK = 4096
BLOCKS = 64
LAYERS = 2
POLL_TIMEOUT = 30  # seconds; bounds every poll loop


def layout(seed):
    return {"layers": LAYERS, "blocks": BLOCKS, "block": BLOCK, "seed": seed}


def start_peer(spawn, name, seed, config=None, env=None):
    import json
    args = [name, json.dumps(layout(seed))]
    if config is not None:
        args.append(json.dumps(config))
    return spawn(*args, script=PEER, env=env)


def short_deadline(seconds, **options):
    """An agent config whose engine gives up on a request after `seconds`
    (Ferry reads FERRY_TRANSFER_TIMEOUT_MS once per process, so tests in one
    process pass the option instead)."""
    conf = nixl_agent_config()
    conf.ferry_options = {"transfer_timeout": seconds, **options}
    return conf


def wait_done(agent, handle, timeout=POLL_TIMEOUT):
    """Polls check_xfer_state like vLLM (once per 'step') until DONE."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = agent.check_xfer_state(handle)
        assert state in ("DONE", "PROC")
        if state == "DONE":
            return
        time.sleep(0.0005)
    raise AssertionError(f"transfer not DONE after {timeout} s")


def sha(data) -> str:
    return hashlib.sha256(np.asarray(data).tobytes()).hexdigest()


class LocalKV:
    """Decode/prefill-side DRAM regions registered the vLLM way, with a local
    prepared list of every block (layer-major)."""

    def __init__(self, agent, seed=None):
        self.agent = agent
        self.kv = [np.zeros(BLOCKS * BLOCK, np.uint8) for _ in range(LAYERS)]
        if seed is not None:
            for layer, t in enumerate(self.kv):
                t[:] = pattern(seed + layer, t.nbytes)
        descs = agent.get_reg_descs([(t.ctypes.data, t.nbytes, 0, "") for t in self.kv], "DRAM")
        assert descs is not None
        self.reg = agent.register_memory(descs)
        self.rows = np.array([(t.ctypes.data + b * BLOCK, BLOCK, 0)
                              for t in self.kv for b in range(BLOCKS)], dtype=np.uint64)
        self.local = agent.prep_xfer_dlist(NIXL_INIT_AGENT, self.rows, "DRAM")

    def block(self, layer, b):
        return self.kv[layer][b * BLOCK:(b + 1) * BLOCK]

    def close(self):
        self.agent.release_dlist_handle(self.local)
        self.agent.deregister_memory(self.reg)


def remote_rows(hello):
    return np.array([(addr + b * BLOCK, BLOCK, 0) for addr, _n in hello["regions"]
                     for b in range(BLOCKS)], dtype=np.uint64)


def expected_block(seed, layer, b):
    return pattern(seed + layer, BLOCKS * BLOCK)[b * BLOCK:(b + 1) * BLOCK]


@pytest.fixture
def agents():
    """Agents made by the test, closed at the end."""
    made = []

    def make(name, conf=None):
        a = nixl_agent(name, conf)
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()


# ---- Package surface --------------------------------------------------------------------
def test_package_is_found_with_its_version_and_names():
    assert importlib.util.find_spec("nixl") is not None
    assert importlib.metadata.version("nixl") == "1.5.0" == nixl.__version__
    from nixl import nixl_agent as from_package
    assert from_package is nixl_agent
    from nixl._api import nixlBind  # LightLLM's spelling
    assert nixlBind.nixlNotFoundError is nixlNotFoundError
    import nixl._bindings as b
    for name in ("nixlNotPostedError", "nixlInvalidParamError", "nixlBackendError",
                 "nixlNotFoundError", "nixlMismatchError", "nixlNotAllowedError",
                 "nixlRepostActiveError", "nixlUnknownError", "nixlNotSupportedError",
                 "nixlRemoteDisconnectError", "nixlCancelledError", "nixlNoTelemetryError"):
        cls = getattr(b, name)
        assert issubclass(cls, RuntimeError) and cls is not RuntimeError
    assert len({getattr(b, n) for n in b.__all__ if n.endswith("Error") and n != "nixlError"}) == 12
    assert b.NIXL_INIT_AGENT == "" and isinstance(b.DEFAULT_COMM_PORT, int)
    t = nixlXferTelemetry(1, 2, 3, 4, 5)
    assert (t.startTime, t.postDuration, t.xferDuration, t.totalBytes, t.descCount) == (1, 2, 3, 4, 5)


def test_config_backends_and_memory_types(agents):
    conf = nixl_agent_config()
    assert conf.backends == ["UCX"] and conf.capture_telemetry is False
    a = agents("cfg-a", nixl_agent_config(num_threads=4, capture_telemetry=True))
    assert a.name == "cfg-a" and "UCX" in a.backends and a.backends["UCX"]
    assert {"UCX", "LIBFABRIC", "FERRY"} <= set(a.get_plugin_list()) == set(a.plugin_list)
    b = agents("cfg-b", nixl_agent_config(backends=[]))
    assert b.backends == {}
    b.create_backend("LIBFABRIC", {})
    assert list(b.backends) == ["LIBFABRIC"]
    with pytest.raises(nixlNotFoundError, match="UCX, LIBFABRIC, FERRY"):
        b.create_backend("NO_SUCH_PLUGIN", {})
    with pytest.raises(nixlNotSupportedError, match="cuFile"):
        b.create_backend("GDS", {})  # named: what it would need, and POSIX instead
    c = agents("cfg-c", nixl_agent_config(backends=["GDS"]))  # skipped with a warning, as NIXL
    assert c.backends == {}
    assert b.get_plugin_mem_types("LIBFABRIC") == ["DRAM", "VRAM"] == b.backend_mems["LIBFABRIC"]
    buf = np.zeros(4096, np.uint8)
    # Host memory as VRAM: refused by the driver's check (or for want of a
    # driver), naming the device; nothing registered.
    with pytest.raises((nixlBackendError, nixlInvalidParamError), match="cuda:0"):
        b.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "VRAM")
    assert b.get_xfer_descs([(buf.ctypes.data, 16, 0)], "cuda").getType() == nixlBind.VRAM_SEG
    with pytest.raises(nixlNotSupportedError, match="OBJ memory is not supported"):
        b.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "OBJ")
    reg = b.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "cpu", is_sorted=False)
    with pytest.raises(nixlNotFoundError):
        b.prep_xfer_dlist("", [(buf.ctypes.data, 16, 0)], "DRAM", backends=["UCX"])  # not created
    b.deregister_memory(reg)


# ---- vLLM pull mode ---------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_vllm_pull_mode_reads_scattered_blocks_with_notifications(spawn, agents, transport):
    """auto: shm between the two processes (tcp where this host refuses same-host copies)."""
    prefill = start_peer(spawn, "prefill-0b6e", seed=11, config={"backends": ["UCX"]},
                         env=child_env(FERRY_TRANSPORT=transport))
    conf = nixl_agent_config(num_threads=2, capture_telemetry=True)
    conf.ferry_options = {"transport": transport}  # FERRY_* is read once per process
    decode = agents("decode-77f1", conf)
    kv = LocalKV(decode)
    kv.local_literal = decode.prep_xfer_dlist("NIXL_INIT_AGENT", kv.rows, "DRAM")  # vLLM's spelling
    decode.release_dlist_handle(kv.local_literal)

    # metadata over the side channel (the child's stdout pipe)
    name = decode.add_remote_agent(bytes.fromhex(prefill.hello["metadata"]))
    assert name == b"prefill-0b6e"
    assert decode.check_remote_metadata("prefill-0b6e")
    remote = decode.prep_xfer_dlist(name, remote_rows(prefill.hello), "DRAM")

    rng = np.random.default_rng(3)
    requests = 12
    expected = {}  # (layer, local block) -> (layer, remote block)
    free_local = list(rng.permutation(BLOCKS))
    for r in range(requests):
        n = int(rng.integers(1, 5))
        local_blocks = [free_local.pop() for _ in range(n)]
        remote_blocks = list(rng.choice(BLOCKS, n, replace=False))
        if r == 0:  # one run contiguous on both sides: merged
            local_blocks, remote_blocks = [60, 61, 62], [10, 11, 12]
            for b in local_blocks:
                if b in free_local:
                    free_local.remove(b)
        lids = np.array([layer * BLOCKS + b for layer in range(LAYERS) for b in local_blocks],
                        dtype=np.int64)
        rids = [layer * BLOCKS + int(b) for layer in range(LAYERS) for b in remote_blocks]
        handle = decode.make_prepped_xfer("READ", kv.local, lids, remote, rids,
                                          notif_msg=f"req-{r}:1".encode())
        assert handle and hash(handle) == hash(handle)
        assert decode.transfer(handle) in ("DONE", "PROC")
        wait_done(decode, handle)
        t = decode.get_xfer_telemetry(handle)
        assert t.totalBytes == len(lids) * BLOCK
        assert t.descCount == len(lids)  # the caller's descriptors, as NIXL counts them
        assert t.startTime > 0 and t.xferDuration > 0  # DONE: it took some time
        decode.release_xfer_handle(handle)
        for layer in range(LAYERS):
            for lb, rb in zip(local_blocks, remote_blocks):
                expected[(layer, lb)] = (layer, int(rb))

    for layer in range(LAYERS):
        for b in range(BLOCKS):
            got = kv.block(layer, b)
            if (layer, b) in expected:
                assert sha(got) == sha(expected_block(11, *expected[(layer, b)])), (layer, b)
            else:
                assert not got.any(), f"block {layer}/{b} was not read but changed"

    # prefill counts its readers: one notification per request, after its data
    notes = prefill.request("notifs", count=requests)["notes"]
    assert list(notes) == ["decode-77f1"]
    assert sorted(n["text"] for n in notes["decode-77f1"]) == sorted(
        f"req-{r}:1" for r in range(requests))

    # heartbeats (standalone notifications), ordered per sender
    for i in range(20):
        decode.send_notif("prefill-0b6e", f"HB:{i}".encode())
    notes = prefill.request("notifs", count=20)["notes"]["decode-77f1"]
    assert [n["text"] for n in notes] == [f"HB:{i}" for i in range(20)]

    # teardown as vLLM does it
    decode.release_dlist_handle(remote)
    decode.remove_remote_agent("prefill-0b6e")
    assert not decode.check_remote_metadata("prefill-0b6e")
    kv.close()


def test_vllm_push_mode_and_regions_registered_later(spawn, agents):
    """Decode registers with the prefill by notification (PUSH_REG + its
    metadata); the prefill's writer thread loads it and writes the blocks."""
    decode = start_peer(spawn, "decode-push", seed=None)
    prefill = agents("prefill-push")
    kv = LocalKV(prefill, seed=21)
    decode.request("add_remote", hex=prefill.get_agent_metadata().hex())
    decode.request("send", name="prefill-push",
                   messages=["PUSH_REG" + decode.hello["metadata"]])

    errors = []

    def writer():
        try:
            deadline = time.monotonic() + POLL_TIMEOUT
            while time.monotonic() < deadline:
                for sender, msgs in prefill.get_new_notifs().items():
                    for m in msgs:
                        assert sender == "decode-push" and m.startswith(b"PUSH_REG")
                        name = prefill.add_remote_agent(bytes.fromhex(m[8:].decode()))
                        remote = prefill.prep_xfer_dlist(name, remote_rows(decode.hello), "DRAM")
                        ids = list(range(LAYERS * BLOCKS))
                        h = prefill.make_prepped_xfer("WRITE", kv.local, ids, remote, ids,
                                                      notif_msg=b"pushed")
                        prefill.transfer(h)
                        wait_done(prefill, h)
                        prefill.release_xfer_handle(h)
                        prefill.release_dlist_handle(remote)
                        return
                time.sleep(0.001)
            raise AssertionError("no PUSH_REG arrived")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    t.join(POLL_TIMEOUT + 10)
    assert not t.is_alive() and not errors, errors
    assert decode.request("notifs", count=1)["notes"]["prefill-push"][0]["text"] == "pushed"
    assert decode.request("sha")["sha"] == [sha(x) for x in kv.kv]

    # memory registered after the metadata exchange is unseen until loaded again
    extra = np.zeros(8192, np.uint8)
    reg = prefill.register_memory([(extra.ctypes.data, extra.nbytes, 0, "")], "DRAM")
    decode_agent = nixl_agent("reader-late")
    try:
        decode_agent.add_remote_agent(bytes.fromhex(decode.hello["metadata"]))
        name = decode_agent.add_remote_agent(prefill.get_agent_metadata())
        rows = [(extra.ctypes.data, extra.nbytes, 0)]
        assert decode_agent.check_remote_metadata(name, rows)
        decode_agent.prep_xfer_dlist(name, rows, "DRAM")
    finally:
        decode_agent.close()
    prefill.deregister_memory(reg)
    kv.close()


# ---- SGLang push order ------------------------------------------------------------------
def test_sglang_writer_threads_initialize_xfer_and_aux_notifications(spawn, agents):
    decode = start_peer(spawn, "decode-sgl", seed=None)
    prefill = agents("prefill-sgl", nixl_agent_config(backends=[], num_threads=4))
    prefill.create_backend("UCX", {})
    assert "UCX" in prefill.get_plugin_list()
    kv = LocalKV(prefill, seed=31)
    name = prefill.add_remote_agent(bytes.fromhex(decode.hello["metadata"]))
    rrows = remote_rows(decode.hello)
    remote_prepped = prefill.prep_xfer_dlist(name, rrows, "DRAM")

    # block b of each layer goes to decode block (b * 7 + 3) % BLOCKS
    dest = {b: (b * 7 + 3) % BLOCKS for b in range(BLOCKS)}
    errors = []

    def worker(w):
        try:
            for b in range(w, BLOCKS, 4):
                if b % 2:  # one-shot descriptors, as SGLang's send_kvcache does
                    local_descs = prefill.get_xfer_descs(
                        [(int(kv.rows[layer * BLOCKS + b][0]), BLOCK, 0) for layer in range(LAYERS)],
                        "DRAM")
                    remote_descs = prefill.get_xfer_descs(
                        np.array([rrows[layer * BLOCKS + dest[b]] for layer in range(LAYERS)]),
                        "DRAM")
                    h = prefill.initialize_xfer("WRITE", local_descs, remote_descs, name,
                                                f"kv:{b}".encode(), backends=["UCX"])
                else:  # prepared lists
                    ids = [layer * BLOCKS + b for layer in range(LAYERS)]
                    rids = [layer * BLOCKS + dest[b] for layer in range(LAYERS)]
                    h = prefill.make_prepped_xfer("WRITE", kv.local, ids, remote_prepped, rids,
                                                  notif_msg=f"kv:{b}".encode())
                state = prefill.transfer(h)
                deadline = time.monotonic() + POLL_TIMEOUT
                while state != "DONE":  # SGLang polls in a tight loop
                    assert time.monotonic() < deadline, "transfer did not finish"
                    state = prefill.check_xfer_state(h)
                    assert state in ("DONE", "PROC")
                prefill.release_xfer_handle(h)
                prefill.send_notif(name, f"aux:{b}".encode())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(POLL_TIMEOUT * 2)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    notes = decode.request("notifs", count=2 * BLOCKS)["notes"]["prefill-sgl"]
    texts = [n["text"] for n in notes]
    assert sorted(texts) == sorted([f"kv:{b}" for b in range(BLOCKS)] +
                                   [f"aux:{b}" for b in range(BLOCKS)])
    for b in range(BLOCKS):  # a block's data notification comes before its aux one
        assert texts.index(f"kv:{b}") < texts.index(f"aux:{b}")

    want = [np.zeros(BLOCKS * BLOCK, np.uint8) for _ in range(LAYERS)]
    for layer in range(LAYERS):
        for b in range(BLOCKS):
            want[layer][dest[b] * BLOCK:(dest[b] + 1) * BLOCK] = kv.block(layer, b)
    assert decode.request("sha")["sha"] == [sha(x) for x in want]
    prefill.release_dlist_handle(remote_prepped)
    kv.close()


# ---- Bad input --------------------------------------------------------------------------
def test_bad_descriptors_give_none_with_a_logged_error(agents, nixl_caplog):
    caplog = nixl_caplog
    a = agents("bad-descs")
    caplog.set_level(logging.ERROR, logger="nixl")
    buf = np.zeros(4096, np.uint8)
    good = a.get_xfer_descs([(buf.ctypes.data, 16, 0)], "DRAM")
    assert good and good.descCount() == 1
    import pickle
    copy = pickle.loads(pickle.dumps(good))  # descriptor lists travel between processes
    assert copy == good and copy.getType() == nixlBind.DRAM_SEG
    assert copy[0] == (buf.ctypes.data, 16, 0)
    reg = a.get_reg_descs([(buf.ctypes.data, 4096, 0, "meta")], "DRAM")
    assert pickle.loads(pickle.dumps(reg))[0] == (buf.ctypes.data, 4096, 0, b"meta")
    for bad in ("junk", object(), np.zeros((3, 4), np.uint64), np.zeros((3, 3), np.float64),
                np.array([[1, -5, 0]], np.int64), [(1, 2)], [(1, 2, "x")]):
        caplog.clear()
        assert a.get_xfer_descs(bad, "DRAM") is None, bad
        assert caplog.records and "get_xfer_descs" in caplog.records[0].getMessage()
    assert a.get_reg_descs("junk") is None
    assert a.get_reg_descs([(1, 2, 0, 5)]) is None  # meta is not a str
    assert a.get_reg_descs(np.zeros((2, 5), np.uint64)) is None
    rows5 = np.array([[buf.ctypes.data, 16, 0, 32, 4]], np.uint64)
    assert a.get_xfer_descs(rows5) is None  # strided rows need mem_type
    assert a.get_xfer_descs(rows5, "DRAM").descCount() == 4  # one row, four entries
    with pytest.raises(nixlInvalidParamError):
        a.register_memory("junk")
    with pytest.raises(nixlInvalidParamError):
        a.add_remote_agent(b"not metadata")
    # a zero-length row makes a list (as NIXL's) but is refused when prepared
    reg = a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    zero = a.get_xfer_descs(np.array([[buf.ctypes.data, 0, 0]], np.uint64), "DRAM")
    with pytest.raises(nixlInvalidParamError, match="length 0|zero"):
        a.prep_xfer_dlist("", zero)
    a.deregister_memory(reg)


def test_damaged_metadata_is_refused_cleanly(agents):
    """Every truncation and 2,000 random byte flips of real metadata (full and partial):
    either it loads (a flip in a field nobody checks) or a NIXL error says why; nothing else."""
    a, b = agents("md-a"), agents("md-b")
    buf = np.zeros(8192, np.uint8)
    reg = b.register_memory([(buf.ctypes.data, 4096, 0, ""),
                             (buf.ctypes.data + 4096, 4096, 0, "")], "DRAM")
    full = b.get_agent_metadata()
    part = b.get_partial_agent_metadata(b.get_reg_descs([(buf.ctypes.data, 4096, 0, "")], "DRAM"))
    assert a.add_remote_agent(part) == b"md-b"
    assert a.check_remote_metadata("md-b", [(buf.ctypes.data, 64, 0)])
    assert not a.check_remote_metadata("md-b", [(buf.ctypes.data + 4096, 64, 0)])  # not listed
    assert a.add_remote_agent(full) == b"md-b"
    assert a.check_remote_metadata("md-b", [(buf.ctypes.data + 4096, 64, 0)])  # now visible
    rng = np.random.default_rng(28)
    cases = [m[:n] for m in (full, part) for n in range(len(m))]
    for _ in range(2000):
        m = bytearray(full if rng.integers(2) else part)
        m[int(rng.integers(len(m)))] = int(rng.integers(256))
        cases.append(bytes(m))
    for m in cases:
        c = agents("md-c")
        try:
            c.add_remote_agent(m)
        except nixlBind.nixlError:
            pass
        c.close()
    b.deregister_memory(reg)


def test_partial_metadata_with_a_region_past_the_address_space_is_refused(agents):
    """A listed region whose end does not fit 64 bits (what a damaged length
    prefix reads as a region) is refused as damaged metadata, not an OverflowError."""
    import struct
    b = agents("md-b")
    buf = np.zeros(4096, np.uint8)
    reg = b.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
    part = bytearray(b.get_partial_agent_metadata(
        b.get_reg_descs([(buf.ctypes.data, 4096, 0, "")], "DRAM")))
    at = len(b"FERRY-NIXL\x02")
    for _ in range(2):  # name, peer id
        at += 4 + struct.unpack_from("<I", part, at)[0]
    assert struct.unpack_from("<I", part, at)[0] == 1  # one region row follows
    struct.pack_into("<Q", part, at + 4, (1 << 64) - 100)  # its address
    with pytest.raises(nixlInvalidParamError, match="damaged"):
        agents("md-c").add_remote_agent(bytes(part))
    b.deregister_memory(reg)


def test_invalid_params_not_found_and_telemetry_off(spawn, agents):
    prefill = start_peer(spawn, "prefill-bad", seed=5)
    a = agents("decode-bad")  # no capture_telemetry
    kv = LocalKV(a)
    name = a.add_remote_agent(bytes.fromhex(prefill.hello["metadata"]))
    remote = a.prep_xfer_dlist(name, remote_rows(prefill.hello), "DRAM")
    n = LAYERS * BLOCKS

    # a row outside the peer's registered memory: refused locally, at prep time
    base, size = prefill.hello["regions"][0]
    for rows in ([(base + size, BLOCK, 0)], [(base + size - 16, 32, 0)], [(0x10, 16, 0)]):
        with pytest.raises(nixlNotFoundError, match="NOT_FOUND"):
            a.prep_xfer_dlist(name, rows, "DRAM")
    strided = np.array([[base, BLOCK, 0, BLOCK, BLOCKS + 1]], np.uint64)  # one entry too many
    with pytest.raises(nixlNotFoundError):
        a.prep_xfer_dlist(name, strided, "DRAM")
    with pytest.raises(nixlNotFoundError, match="no remote agent"):
        a.prep_xfer_dlist("nobody", remote_rows(prefill.hello), "DRAM")
    with pytest.raises(nixlNotFoundError):
        a.send_notif("nobody", b"x")
    assert not a.check_remote_metadata("nobody")
    assert not a.check_remote_metadata(name, [(base + size, BLOCK, 0)])
    assert a.check_remote_metadata(name, [(base, BLOCK, 0)])

    # mismatched counts, lengths, indices, op
    half = a.prep_xfer_dlist(name, [(base, BLOCK // 2, 0)], "DRAM")
    cases = [
        ("READ", kv.local, [0, 1], remote, [0]),                 # counts differ
        ("READ", kv.local, [0], half, [0]),                      # lengths differ
        ("READ", kv.local, [n], remote, [0]),                    # local index out of range
        ("READ", kv.local, [0], remote, [n + 5]),                # remote index out of range
        ("READ", kv.local, np.array([-1], np.int64), remote, [0]),  # negative
        ("READ", kv.local, [0], remote, np.array([1 << 33], np.int64)),  # > 32 bits
        ("COPY", kv.local, [0], remote, [0]),                    # unknown op
        ("READ", remote, [0], remote, [0]),                      # remote list as local side
        ("READ", kv.local, [0], kv.local, [0]),                  # local list as remote side
    ]
    for op, lh, li, rh, ri in cases:
        with pytest.raises(nixlInvalidParamError):
            a.make_prepped_xfer(op, lh, li, rh, ri)
    with pytest.raises(nixlInvalidParamError, match="position 1"):
        a.make_prepped_xfer("READ", kv.local, [0, -3], remote, [0, 1])
    with pytest.raises(nixlInvalidParamError, match="3 local descriptors but 2 remote"):
        a.initialize_xfer("READ", kv.rows[:3], remote_rows(prefill.hello)[:2], name)

    h = a.make_prepped_xfer("READ", kv.local, [0], remote, [0])
    assert a.transfer(h) in ("DONE", "PROC")
    wait_done(a, h)
    assert sha(kv.block(0, 0)) == sha(expected_block(5, 0, 0))
    with pytest.raises(nixlNoTelemetryError):
        a.get_xfer_telemetry(h)
    a.release_xfer_handle(h)
    a.release_dlist_handle(half)

    # handles of a removed agent
    h = a.make_prepped_xfer("READ", kv.local, [1], remote, [1])
    a.remove_remote_agent(name)
    assert a.remove_remote_agent(name) is None  # does not raise
    with pytest.raises(nixlNotFoundError, match="removed"):
        a.transfer(h)
    with pytest.raises(nixlNotFoundError):
        a.check_xfer_state(h)
    a.release_xfer_handle(h)
    kv.close()


def test_repost_while_active_is_refused_then_reposts_when_done(spawn, agents):
    prefill = start_peer(spawn, "prefill-repost", seed=9)
    a = agents("decode-repost", nixl_agent_config(capture_telemetry=True))
    kv = LocalKV(a)
    name = a.add_remote_agent(bytes.fromhex(prefill.hello["metadata"]))
    remote = a.prep_xfer_dlist(name, remote_rows(prefill.hello), "DRAM")
    ids = list(range(LAYERS * BLOCKS))
    h = a.make_prepped_xfer("READ", kv.local, ids, remote, ids)
    a.transfer(h)
    wait_done(a, h)
    first = a.get_xfer_telemetry(h)
    assert [sha(t) for t in kv.kv] == [sha(pattern(9 + l, BLOCKS * BLOCK)) for l in range(LAYERS)]

    prefill.request("fill", seed=90)
    prefill.pause()  # the peer answers nothing: the repost stays in flight
    try:
        assert a.transfer(h) == "PROC"
        with pytest.raises(nixlRepostActiveError, match="still in flight"):
            a.transfer(h)
        assert a.check_xfer_state(h) == "PROC"
    finally:
        prefill.resume()
    wait_done(a, h)
    assert [sha(t) for t in kv.kv] == [sha(pattern(90 + l, BLOCKS * BLOCK)) for l in range(LAYERS)]
    second = a.get_xfer_telemetry(h)
    assert second.startTime > first.startTime and second.totalBytes == first.totalBytes
    assert second.descCount == first.descCount == LAYERS * BLOCKS  # the caller's descriptors
    a.release_xfer_handle(h)
    a.release_dlist_handle(remote)
    kv.close()


# ---- Peers that die or restart ------------------------------------------------------------
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_killed_peer_raises_remote_disconnect_within_the_deadline(spawn, agents, transport):
    prefill = start_peer(spawn, "prefill-dies", seed=3,
                         env=child_env(FERRY_TRANSPORT=transport, FERRY_TRANSFER_TIMEOUT_MS="2000"))
    a = agents("decode-survives", short_deadline(2.0, transport=transport))
    kv = LocalKV(a)
    name = a.add_remote_agent(bytes.fromhex(prefill.hello["metadata"]))
    remote = a.prep_xfer_dlist(name, remote_rows(prefill.hello), "DRAM")
    h = a.make_prepped_xfer("READ", kv.local, [0, 5], remote, [7, 9])
    a.transfer(h)
    wait_done(a, h)

    prefill.pause()
    a.transfer(h)  # in flight when the peer dies
    prefill.kill()
    start = time.monotonic()
    with pytest.raises(nixlRemoteDisconnectError):  # bounded: the deadline is 2 s
        while time.monotonic() - start < 10:
            assert a.check_xfer_state(h) in ("PROC", "DONE")
            time.sleep(0.001)
    assert not a.check_remote_metadata(name)
    h2 = a.make_prepped_xfer("READ", kv.local, [1], remote, [1])
    with pytest.raises(nixlRemoteDisconnectError):
        a.transfer(h2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            a.check_xfer_state(h2)
            time.sleep(0.001)
    with pytest.raises(nixlRemoteDisconnectError):
        a.send_notif(name, b"anyone?")
    a.release_xfer_handle(h)
    a.release_xfer_handle(h2)
    kv.close()


def test_stalled_peer_times_out_as_a_backend_error(spawn, agents):
    """A peer that is alive but answers nothing past the deadline: the
    transfer fails (nixlBackendError, DEADLINE_EXCEEDED), the peer is not
    declared gone, and the same handle works once it answers again."""
    prefill = start_peer(spawn, "prefill-stalls", seed=4)
    a = agents("decode-waits", short_deadline(1.0))
    kv = LocalKV(a)
    name = a.add_remote_agent(bytes.fromhex(prefill.hello["metadata"]))
    remote = a.prep_xfer_dlist(name, remote_rows(prefill.hello), "DRAM")
    h = a.make_prepped_xfer("READ", kv.local, [0], remote, [3])
    a.transfer(h)
    wait_done(a, h)
    kv.kv[0][:] = 0
    prefill.pause()
    try:
        a.transfer(h)
        with pytest.raises(nixlBackendError, match="DEADLINE_EXCEEDED"):
            wait_done(a, h)
        assert a.check_remote_metadata(name)
    finally:
        prefill.resume()
    a.transfer(h)
    wait_done(a, h)
    assert sha(kv.block(0, 0)) == sha(expected_block(4, 0, 3))
    a.release_xfer_handle(h)
    a.release_dlist_handle(remote)
    kv.close()


def test_restarted_peer_old_list_refused_new_metadata_works(spawn, agents):
    port = free_port()
    config = {"ferry_options": {"listen_port": port}}  # the engine's address: the same again
    prefill = start_peer(spawn, "prefill-phoenix", seed=40, config=config)
    a = agents("decode-phoenix", short_deadline(5.0))
    kv = LocalKV(a)
    name = a.add_remote_agent(bytes.fromhex(prefill.hello["metadata"]))
    old = a.prep_xfer_dlist(name, remote_rows(prefill.hello), "DRAM")
    h = a.make_prepped_xfer("READ", kv.local, [0], old, [0])
    a.transfer(h)
    wait_done(a, h)
    assert sha(kv.block(0, 0)) == sha(expected_block(40, 0, 0))
    prefill.close()

    reborn = start_peer(spawn, "prefill-phoenix", seed=50, config=config)
    assert reborn.hello["metadata"] != prefill.hello["metadata"]
    # before its new metadata is loaded: the old list is refused, never used on the new instance
    with pytest.raises((nixlNotFoundError, nixlRemoteDisconnectError)):
        a.transfer(h)
        wait_done(a, h)
    assert a.add_remote_agent(bytes.fromhex(reborn.hello["metadata"])) == name
    with pytest.raises(nixlNotFoundError, match="restarted"):
        a.transfer(h)
        wait_done(a, h)
    new = a.prep_xfer_dlist(name, remote_rows(reborn.hello), "DRAM")
    h2 = a.make_prepped_xfer("READ", kv.local, [0, 1], new, [0, 1])
    a.transfer(h2)
    wait_done(a, h2)
    assert sha(kv.block(0, 0)) == sha(expected_block(50, 0, 0))
    assert sha(kv.block(0, 1)) == sha(expected_block(50, 0, 1))
    assert a.check_remote_metadata(name)
    for handle in (h, h2):
        a.release_xfer_handle(handle)
    a.release_dlist_handle(old)
    a.release_dlist_handle(new)
    kv.close()


# ---- Notifications and threads --------------------------------------------------------------
def test_one_mib_notification(spawn, agents):
    peer = start_peer(spawn, "big-notes", seed=None)
    a = agents("sender-big")
    name = a.add_remote_agent(bytes.fromhex(peer.hello["metadata"]))
    msg = pattern(77, 1 << 20).tobytes()
    a.send_notif(name, msg)
    a.send_notif(name, b"after")
    notes = peer.request("notifs", count=2)["notes"]["sender-big"]
    assert [n["len"] for n in notes] == [1 << 20, 5]
    assert notes[0]["sha"] == hashlib.sha256(msg).hexdigest() and notes[1]["text"] == "after"
    with pytest.raises((nixlInvalidParamError, nixlBackendError)):
        a.send_notif(name, bytes((1 << 20) + 1))


def test_eight_threads_on_one_agent(spawn, agents):
    prefill = start_peer(spawn, "prefill-threads", seed=60)
    a = agents("decode-threads", nixl_agent_config(capture_telemetry=True))
    kv = LocalKV(a)
    name = a.add_remote_agent(bytes.fromhex(prefill.hello["metadata"]))
    remote = a.prep_xfer_dlist(name, remote_rows(prefill.hello), "DRAM")
    errors = []
    per_thread = BLOCKS // 8

    def worker(w):
        try:
            for i in range(per_thread):
                b = w * per_thread + i  # each thread reads its own blocks
                ids = [layer * BLOCKS + b for layer in range(LAYERS)]
                rids = [layer * BLOCKS + (BLOCKS - 1 - b) for layer in range(LAYERS)]
                h = a.make_prepped_xfer("READ", kv.local, ids, remote, rids,
                                        notif_msg=f"t{w}:{i}".encode())
                a.transfer(h)
                wait_done(a, h)
                assert a.get_xfer_telemetry(h).totalBytes == LAYERS * BLOCK
                a.release_xfer_handle(h)
                a.send_notif(name, f"hb{w}:{i}".encode())
                assert a.check_remote_metadata(name)
                a.get_new_notifs()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(POLL_TIMEOUT * 2)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    for layer in range(LAYERS):
        for b in range(BLOCKS):
            assert sha(kv.block(layer, b)) == sha(expected_block(60, layer, BLOCKS - 1 - b))
    notes = prefill.request("notifs", count=2 * BLOCKS)["notes"]["decode-threads"]
    texts = [n["text"] for n in notes]
    assert len(texts) == 2 * BLOCKS
    for w in range(8):  # per thread, in order
        hb = [t for t in texts if t.startswith(f"hb{w}:")]
        assert hb == [f"hb{w}:{i}" for i in range(per_thread)]
    a.release_dlist_handle(remote)
    kv.close()


def test_dropped_handles_are_safe(agents):
    """Handles dropped without release (some in flight) are cancelled and
    released when collected; the agent keeps working and memory deregisters."""
    a = agents("dropper")
    b = agents("dropped")
    kv_a, kv_b = LocalKV(a, seed=1), LocalKV(b)
    name = b.add_remote_agent(a.get_agent_metadata())
    remote = b.prep_xfer_dlist(name, kv_a.rows, "DRAM")
    for _ in range(20):
        h = b.make_prepped_xfer("READ", kv_b.local, [0, 1], remote, [2, 3])
        b.transfer(h)
        del h  # never released
    import gc
    gc.collect()
    h = b.make_prepped_xfer("READ", kv_b.local, [4], remote, [5])
    b.transfer(h)
    wait_done(b, h)
    assert sha(kv_b.block(0, 4)) == sha(kv_a.block(0, 5))
    del h, remote  # the prepared list too
    gc.collect()
    kv_b.agent.deregister_memory(kv_b.reg)  # nothing left in flight pins it
    kv_a.close()
