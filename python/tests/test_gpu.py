"""GPU memory from Python against the tests' fake CUDA driver (fakecuda.py):
the engine option testing_cuda_driver, the nixl drop-in's VRAM, torch-like
CUDA tensors, and the Mooncake drop-in's locations. The fake's device memory
is PROT_NONE to the CPU, so every byte here moves through the driver's
copies; every byte moved is checked.

Engines of one process reach each other over ``local``, which moves host
memory only, and CUDA IPC refuses a process's own handles: the transfers
here run over tcp, which stages GPU memory through host buffers on either
side (the initiator's through page-locked buffers, the target's in its
stream service); shm stages the initiator's only."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from fakecuda import FakeCudaTensor
from peer import pattern

import nixl._bindings as nixlBind
from nixl._api import nixl_agent, nixl_agent_config
from nixl._bindings import NIXL_INIT_AGENT, nixlBackendError, nixlInvalidParamError

BLOCK = 4096
BLOCKS = 16
POLL_TIMEOUT = 30  # seconds


def wait_done(agent, handle, timeout=POLL_TIMEOUT):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.check_xfer_state(handle) == "DONE":
            return
        time.sleep(0.0005)
    raise AssertionError(f"transfer not DONE after {timeout} s")


@pytest.fixture
def device_memory(fake_cuda):
    """alloc(nbytes) -> device pointer of the fake (freed at teardown, after
    the test closed its engines)."""
    made = []

    def alloc(nbytes):
        ptr = fake_cuda.alloc(nbytes)
        made.append(ptr)
        return ptr

    yield alloc
    for ptr in made:
        fake_cuda.free(ptr)


def gpu_conf(fake_cuda, **options):
    conf = nixl_agent_config(backends=["UCX"])
    conf.ferry_options = {"transport": "tcp", "testing_cuda_driver": fake_cuda.path}
    conf.ferry_options.update(options)
    return conf


# ---- ferry.Engine ---------------------------------------------------------------------------
def test_testing_cuda_driver_is_an_engine_option(fake_cuda):
    with ferry.Engine(testing_cuda_driver=fake_cuda.path) as e:
        assert e.options["testing_cuda_driver"] == fake_cuda.path
    with ferry.Engine() as e:
        assert e.options["testing_cuda_driver"] == ""


def test_fake_cuda_tensor_registers_as_its_device(fake_cuda, device_memory):
    ptr = device_memory(BLOCK)
    with ferry.Engine(testing_cuda_driver=fake_cuda.path) as e:
        t = FakeCudaTensor(ptr, BLOCK, device=0)
        assert e.register(t) == ptr
        assert e.registered() == {ptr: BLOCK}
        # The descriptor peers see carries the kind.
        with ferry.Engine() as observer:
            regions = observer.query_segment(e.peer_id).regions
            assert [tuple(r) for r in regions] == [(ptr, BLOCK, "cuda:0", "cuda:0")]
        e.unregister(t)
        assert e.registered() == {}
        # The wrong device, and device memory given as host memory: refused, naming why.
        with pytest.raises(ferry.InvalidArgument, match="cuda:1"):
            e.register(FakeCudaTensor(ptr, BLOCK, device=1))
        with pytest.raises(ferry.InvalidArgument, match="register it as cuda:0"):
            e.register(ptr, BLOCK, "cpu")
        # register_many: one location per object, all or nothing.
        host = np.zeros(BLOCK, np.uint8)
        with pytest.raises(ferry.InvalidArgument, match="region 1 of the list"):
            e.register_many([ptr, host.ctypes.data], [BLOCK, BLOCK], ["cuda:0", "cuda:0"])
        assert e.registered() == {}
        e.register_many([FakeCudaTensor(ptr, BLOCK), host])  # "*": each its own kind
        with ferry.Engine() as observer:
            kinds = {r.addr: (r.location, r.kind)
                     for r in observer.query_segment(e.peer_id).regions}
        assert kinds == {ptr: ("cuda:0", "cuda:0"), host.ctypes.data: ("*", "cpu")}
        with pytest.raises(ferry.InvalidArgument, match="2 objects but 1 locations"):
            e.register_many([ptr, ptr + 64], [64, 64], ["cuda:0"])


def test_engine_write_and_read_of_gpu_memory_over_tcp(fake_cuda, device_memory):
    n = BLOCKS * BLOCK
    data = pattern(301, n).tobytes()
    dev = device_memory(n)
    fake_cuda.upload(dev, data)
    target = np.zeros(n, np.uint8)
    with ferry.Engine(transport="tcp", testing_cuda_driver=fake_cuda.path) as gpu, \
            ferry.Engine(transport="tcp") as host:
        gpu.register(dev, n, "cuda:0")
        host.register(target)
        seg = gpu.open_segment(host.peer_id)
        before = fake_cuda.copied(1)
        gpu.write(seg, dev, target.ctypes.data, n)
        assert target.tobytes() == data
        assert fake_cuda.copied(1) - before >= n  # off the GPU through the driver
        fake_cuda.memset(dev, 0, n)
        target[:] = pattern(302, n)
        gpu.read(seg, dev, target.ctypes.data, n)
        assert fake_cuda.download(dev, n) == target.tobytes()

        # GPU to GPU (both sides staged), and a host engine into GPU memory.
        with ferry.Engine(transport="tcp", testing_cuda_driver=fake_cuda.path) as other:
            dev2 = device_memory(n)
            fake_cuda.memset(dev2, 0, n)
            other.register(dev2, n, "cuda:0")
            gpu.write(other.peer_id, dev, dev2, n)
            assert fake_cuda.download(dev2, n) == target.tobytes()
            target[:] = pattern(303, n)
            host.write(other.peer_id, target, dev2, n)
            assert fake_cuda.download(dev2, n) == target.tobytes()


# ---- nixl: VRAM ---------------------------------------------------------------------------
def test_nixl_vram_reports_and_tensor_rows(fake_cuda, device_memory):
    a = nixl_agent("vram-types", gpu_conf(fake_cuda))
    try:
        assert a.get_plugin_mem_types("UCX") == ["DRAM", "VRAM"]
        assert a.backend_mems["UCX"] == ["DRAM", "VRAM"]
        ptr = device_memory(2 * BLOCK)
        tensors = [FakeCudaTensor(ptr, BLOCK), FakeCudaTensor(ptr + BLOCK, BLOCK)]
        reg = a.get_reg_descs(tensors)
        assert reg.getType() == nixlBind.VRAM_SEG
        assert [reg[i][:3] for i in range(reg.descCount())] == [(ptr, BLOCK, 0),
                                                               (ptr + BLOCK, BLOCK, 0)]
        for alias in ("VRAM", "cuda"):
            assert a.get_xfer_descs([(ptr, 16, 0)], alias).getType() == nixlBind.VRAM_SEG
        assert a.get_xfer_descs(FakeCudaTensor(ptr, BLOCK, device=1))[0] == (ptr, BLOCK, 1)
        host = np.zeros(BLOCK, np.uint8)
        # host and device tensors in one list: None (logged), as NIXL
        assert a.get_reg_descs([FakeCudaTensor(ptr, BLOCK), _HostTensor(host)]) is None
        a.register_memory(reg)
        a.deregister_memory(reg)
        # Host memory registered as VRAM: refused, nothing registered.
        with pytest.raises(nixlInvalidParamError, match="not in GPU memory of cuda:0"):
            a.register_memory([(host.ctypes.data, host.nbytes, 0, "")], "VRAM")
        # A list that is half device memory: all or nothing.
        with pytest.raises(nixlInvalidParamError, match="region 1 of the list"):
            a.register_memory([(ptr, BLOCK, 0, ""), (host.ctypes.data, BLOCK, 0, "")], "VRAM")
        a.register_memory([(ptr, 2 * BLOCK, 0, "")], "VRAM")  # nothing of the failures stayed
    finally:
        a.close()


class _HostTensor:
    def __init__(self, array):
        self._a = array
        self.device = type("D", (), {"type": "cpu", "index": None})()

    def data_ptr(self):
        return self._a.ctypes.data

    def numel(self):
        return self._a.size

    def element_size(self):
        return 1


def test_nixl_vram_write_and_read_with_a_dram_agent(fake_cuda, device_memory):
    """Agent gpu (VRAM, fake driver) writes to and reads from agent host's
    DRAM over tcp (gpu's side staged); every byte checked on both ends."""
    n = BLOCKS * BLOCK
    data = pattern(401, n).tobytes()
    dev = device_memory(n)
    fake_cuda.upload(dev, data)
    dram = np.zeros(n, np.uint8)
    gpu = nixl_agent("vram-gpu", gpu_conf(fake_cuda))
    conf = nixl_agent_config(backends=["UCX"])
    conf.ferry_options = {"transport": "tcp"}
    host = nixl_agent("vram-host", conf)
    try:
        gpu_reg = gpu.register_memory(gpu.get_reg_descs([(dev, n, 0, "")], "VRAM"))
        host_reg = host.register_memory(
            host.get_reg_descs([(dram.ctypes.data, dram.nbytes, 0, "")], "DRAM"))
        name = gpu.add_remote_agent(host.get_agent_metadata())
        host.add_remote_agent(gpu.get_agent_metadata())
        gpu_rows = np.array([(dev + b * BLOCK, BLOCK, 0) for b in range(BLOCKS)], np.uint64)
        host_rows = np.array([(dram.ctypes.data + b * BLOCK, BLOCK, 0) for b in range(BLOCKS)],
                             np.uint64)
        local = gpu.prep_xfer_dlist(NIXL_INIT_AGENT, gpu_rows, "VRAM")
        remote = gpu.prep_xfer_dlist(name, host_rows, "DRAM")
        # WRITE the blocks reversed (VRAM block b -> DRAM block BLOCKS-1-b), with a notification.
        ids = list(range(BLOCKS))
        h = gpu.make_prepped_xfer("WRITE", local, ids, remote, ids[::-1], b"vram-written")
        assert gpu.transfer(h) in ("DONE", "PROC")
        wait_done(gpu, h)
        gpu.release_xfer_handle(h)
        expected = b"".join(data[(BLOCKS - 1 - b) * BLOCK:(BLOCKS - b) * BLOCK]
                            for b in range(BLOCKS))
        assert dram.tobytes() == expected
        notes = {}
        import time

        deadline = time.monotonic() + POLL_TIMEOUT
        while not notes and time.monotonic() < deadline:
            notes = host.get_new_notifs()
            time.sleep(0.001)
        assert notes == {"vram-gpu": [b"vram-written"]}

        # READ a new DRAM pattern into the zeroed VRAM (initialize_xfer, in order).
        fake_cuda.memset(dev, 0, n)
        dram[:] = pattern(402, n)
        h = gpu.initialize_xfer("READ", gpu.get_xfer_descs(gpu_rows, "VRAM"),
                                host.get_xfer_descs(host_rows, "DRAM"), name)
        gpu.transfer(h)
        wait_done(gpu, h)
        gpu.release_xfer_handle(h)
        assert fake_cuda.download(dev, n) == dram.tobytes()

        # The DRAM agent reads and writes gpu's VRAM (tcp: gpu's side stages it).
        back = host.prep_xfer_dlist("vram-gpu", gpu_rows, "VRAM")
        mine = host.prep_xfer_dlist(NIXL_INIT_AGENT, host_rows, "DRAM")
        fake_cuda.upload(dev, data)
        dram[:] = 0
        h = host.make_prepped_xfer("READ", mine, ids, back, ids)
        host.transfer(h)
        wait_done(host, h)
        assert dram.tobytes() == data
        dram[:] = pattern(403, n)
        h2 = host.make_prepped_xfer("WRITE", mine, ids, back, ids)
        host.transfer(h2)
        wait_done(host, h2)
        assert fake_cuda.download(dev, n) == dram.tobytes()
        for handle in (h, h2):
            host.release_xfer_handle(handle)
        host.release_dlist_handle(back)
        host.release_dlist_handle(mine)
        gpu.release_dlist_handle(local)
        gpu.release_dlist_handle(remote)
        gpu.deregister_memory(gpu_reg)
        host.deregister_memory(host_reg)
    finally:
        gpu.close()
        host.close()


# ---- Mooncake drop-in ---------------------------------------------------------------------
def test_mooncake_register_memory_of_gpu_memory(TransferEngine, fake_cuda, device_memory):
    ptr = device_memory(2 * BLOCK)
    host = np.zeros(BLOCK, np.uint8)
    te = TransferEngine()
    te.ferry_options = {"testing_cuda_driver": fake_cuda.path}
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        assert te.register_memory(ptr, BLOCK, "cuda:0") == 0
        assert te.register_memory(ptr + BLOCK, BLOCK, "*") == 0  # detected as cuda:0
        with ferry.Engine() as observer:
            peer = f"127.0.0.1:{te.get_rpc_port()}"
            kinds = {r.addr: (r.location, r.kind) for r in observer.query_segment(peer).regions}
        assert kinds == {ptr: ("cuda:0", "cuda:0"), ptr + BLOCK: ("*", "cuda:0")}
        assert te.unregister_memory(ptr) == 0
        assert te.unregister_memory(ptr + BLOCK) == 0
        # Host memory as cuda:0, device memory as cpu:0: -1, the reason kept.
        assert te.register_memory(host.ctypes.data, host.nbytes, "cuda:0") == -1
        assert "not in GPU memory of cuda:0" in te.last_error()
        assert te.register_memory(ptr, BLOCK, "cpu:0") == -1
        assert "register it as cuda:0" in te.last_error()
        assert te.batch_register_memory([ptr, host.ctypes.data], [BLOCK, BLOCK], "cuda:0") == -1
        assert "region 1 of the list" in te.last_error()
        assert te.register_memory(host.ctypes.data, host.nbytes, "cpu:0") == 0
        assert te.batch_register_memory([ptr, ptr + BLOCK], [BLOCK, BLOCK], "cuda:0") == 0
    finally:
        te.close()


def test_mooncake_cuda_location_without_a_driver(TransferEngine):
    """No CUDA driver here (the real one is not loaded by the test): cuda:0
    is refused with FAILED_PRECONDITION (-4), naming why."""
    host = np.zeros(BLOCK, np.uint8)
    te = TransferEngine()
    te.ferry_options = {"testing_cuda_driver": "/nonexistent/libcuda-for-test.so"}
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        assert te.register_memory(host.ctypes.data, host.nbytes, "cuda:0") == -4
        assert "libcuda-for-test.so" in te.last_error()
        assert te.register_memory(host.ctypes.data, host.nbytes, "*") == 0
    finally:
        te.close()


def test_nixl_remote_vram_over_shm_is_refused_naming_the_kinds(fake_cuda, device_memory):
    """shm stages only the initiator's GPU memory: a DRAM agent on shm cannot
    reach a peer's VRAM (cuda_ipc and tcp can), and says so."""
    dev = device_memory(BLOCK)
    dram = np.zeros(BLOCK, np.uint8)
    gpu = nixl_agent("vram-shm-gpu", gpu_conf(fake_cuda, transport="shm"))
    conf = nixl_agent_config(backends=["UCX"])
    conf.ferry_options = {"transport": "shm"}
    host = nixl_agent("vram-shm-host", conf)
    try:
        gpu.register_memory([(dev, BLOCK, 0, "")], "VRAM")
        host.register_memory([(dram.ctypes.data, BLOCK, 0, "")], "DRAM")
        name = host.add_remote_agent(gpu.get_agent_metadata())
        with pytest.raises(nixlBackendError, match="cuda:0 memory of peer"):
            h = host.initialize_xfer("READ", [(dram.ctypes.data, BLOCK, 0)], [(dev, BLOCK, 0)],
                                     name)
            host.transfer(h)
            wait_done(host, h)
        # The other way round works: gpu's VRAM is staged into shm's host copies.
        fake_cuda.upload(dev, pattern(501, BLOCK).tobytes())
        back = gpu.add_remote_agent(host.get_agent_metadata())
        h = gpu.initialize_xfer("WRITE", gpu.get_xfer_descs([(dev, BLOCK, 0)], "VRAM"),
                                [(dram.ctypes.data, BLOCK, 0)], back)
        gpu.transfer(h)
        wait_done(gpu, h)
        assert dram.tobytes() == pattern(501, BLOCK).tobytes()
    finally:
        gpu.close()
        host.close()


def test_nixl_vram_of_a_peer_process_over_cuda_ipc(spawn, fake_cuda):
    """A peer process's VRAM (nixl_peer.py with the fake driver) read into and
    written from this agent's DRAM: transport auto takes cuda_ipc (the fake's
    IPC handles map the peer's device memory here); every byte checked."""
    import hashlib
    import json

    from conftest import TESTS

    layers, seed = 2, 61
    size = BLOCKS * BLOCK
    peer = spawn("vram-ipc-peer", json.dumps({"layers": layers, "blocks": BLOCKS, "block": BLOCK,
                                              "seed": seed, "vram": fake_cuda.path}),
                 json.dumps({"backends": ["UCX"]}), script=TESTS / "nixl_peer.py")
    conf = nixl_agent_config(backends=["UCX"])
    conf.ferry_options = {"testing_cuda_driver": fake_cuda.path}  # transport auto
    a = nixl_agent("vram-ipc-local", conf)
    try:
        kv = [np.zeros(size, np.uint8) for _ in range(layers)]
        reg = a.register_memory([(t.ctypes.data, t.nbytes, 0, "") for t in kv], "DRAM")
        name = a.add_remote_agent(bytes.fromhex(peer.hello["metadata"]))
        remote_rows = np.array([(addr + b * BLOCK, BLOCK, 0) for addr, _n in peer.hello["regions"]
                                for b in range(BLOCKS)], np.uint64)
        local_rows = np.array([(t.ctypes.data + b * BLOCK, BLOCK, 0) for t in kv
                               for b in range(BLOCKS)], np.uint64)
        local = a.prep_xfer_dlist(NIXL_INIT_AGENT, local_rows, "DRAM")
        remote = a.prep_xfer_dlist(name, remote_rows, "VRAM")
        ids = np.arange(len(local_rows), dtype=np.uint32)
        h = a.make_prepped_xfer("READ", local, ids, remote, ids)
        a.transfer(h)
        wait_done(a, h)
        for layer, t in enumerate(kv):
            assert t.tobytes() == pattern(seed + layer, size).tobytes()
        for layer, t in enumerate(kv):
            t[:] = pattern(70 + layer, size)
        h2 = a.make_prepped_xfer("WRITE", local, ids, remote, ids, b"vram-ipc-done")
        a.transfer(h2)
        wait_done(a, h2)
        assert peer.request("sha")["sha"] == [hashlib.sha256(t.tobytes()).hexdigest() for t in kv]
        notes = peer.request("notifs", count=1)["notes"]
        assert [m["text"] for m in notes["vram-ipc-local"]] == ["vram-ipc-done"]
        routes = {(r["transport"], r["opcode"]): r["bytes_completed"]
                  for r in a.agent.engine.metrics()["routes"]}
        assert routes.get(("cuda_ipc", "read")) == layers * size
        assert routes.get(("cuda_ipc", "write")) == layers * size
        for handle in (h, h2):
            a.release_xfer_handle(handle)
        a.release_dlist_handle(local)
        a.release_dlist_handle(remote)
        a.deregister_memory(reg)
    finally:
        a.close()
