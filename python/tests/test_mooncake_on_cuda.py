"""The Mooncake drop-in's *_on_cuda methods: transfers ordered on a CUDA stream.

Against the tests' fake CUDA driver (fakecuda.py), whose streams run their
copies on a worker thread of their own, after a delay the tests can set. The
fake has no cuLaunchHostFunc, so a call synchronizes the stream and moves the
bytes before it returns; the cuLaunchHostFunc path is driven through a stand-in
for that one entry point, which holds the queued host function until the test
runs it as the driver's thread would.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import numpy as np
import pytest

import ferry.mooncake as mc
from conftest import free_port
from peer import pattern

N = 1 << 16
CHUNKS = 4
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_HANDLE = 400
COPY_DELAY_US = 20_000  # long enough that a transfer not ordered after the copy reads zeros


@pytest.fixture
def stream(fake_cuda):
    """A stream of the fake (a worker thread running its copies in order)."""
    lib = fake_cuda.lib
    lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
    lib.ferry_fake_cuda_set_copy_delay_us.argtypes = [ctypes.c_uint]
    handle = ctypes.c_void_p()
    assert lib.cuStreamCreate(ctypes.byref(handle), 0) == 0
    yield handle.value
    lib.ferry_fake_cuda_set_copy_delay_us(0)
    assert lib.cuStreamSynchronize(handle) == 0
    assert lib.cuStreamDestroy_v2(handle) == 0


def queue_copy(fake_cuda, dst: int, src: int, nbytes: int, stream: int) -> None:
    """cuMemcpyAsync on `stream`: queued, run later by the stream's worker."""
    assert fake_cuda.lib.cuMemcpyAsync(dst, src, nbytes, stream) == 0


@pytest.fixture
def pair(fake_cuda):
    """(gpu, host, device pointer, host buffer, host's session id): gpu registers N
    bytes of the fake's device memory, host N bytes of numpy memory."""
    dev = fake_cuda.alloc(N)
    gpu, host = mc.TransferEngine(), mc.TransferEngine()
    gpu.ferry_options = {"testing_cuda_driver": fake_cuda.path}
    assert gpu.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, gpu.last_error()
    assert host.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, host.last_error()
    buf = np.zeros(N, np.uint8)
    assert gpu.register_memory(dev, N, "cuda:0") == 0, gpu.last_error()
    assert host.register_memory(buf.ctypes.data, N, "cpu:0") == 0, host.last_error()
    try:
        yield gpu, host, dev, buf, f"127.0.0.1:{host.get_rpc_port()}"
    finally:
        gpu.close()
        host.close()
        fake_cuda.free(dev)


def chunks(base: int) -> list[int]:
    return [base + i * (N // CHUNKS) for i in range(CHUNKS)]


# ---- Stream order (the fake: synchronize, then transfer) -----------------------------
@pytest.mark.parametrize("batch", [False, True])
def test_write_on_cuda_runs_after_the_work_queued_on_the_stream(fake_cuda, stream, pair, batch):
    gpu, host, dev, buf, name = pair
    data = pattern(11 + batch, N)
    zeros = np.zeros(N, np.uint8)
    fake_cuda.lib.ferry_fake_cuda_set_copy_delay_us(COPY_DELAY_US)
    # Queued on the stream, each after the copy delay: zeros twice, then the data
    # (a write not ordered after them would send zeros).
    for source in (zeros, zeros, data):
        queue_copy(fake_cuda, dev, source.ctypes.data, N, stream)
    if batch:
        result = gpu.batch_transfer_write_on_cuda(name, chunks(dev), chunks(buf.ctypes.data),
                                                  [N // CHUNKS] * CHUNKS, stream)
    else:
        result = gpu.transfer_write_on_cuda(name, dev, buf.ctypes.data, N, stream)
    assert result is None  # Mooncake's methods return None
    assert buf.tobytes() == data.tobytes()  # the copy ran first, then the write


@pytest.mark.parametrize("batch", [False, True])
def test_read_on_cuda_lands_before_the_work_queued_after_it(fake_cuda, stream, pair, batch):
    gpu, host, dev, buf, name = pair
    data = pattern(21 + batch, N)
    buf[:] = data
    out = np.zeros(N, np.uint8)
    fake_cuda.memset(dev, 0, N)
    if batch:
        gpu.batch_transfer_read_on_cuda(name, chunks(dev), chunks(buf.ctypes.data),
                                        [N // CHUNKS] * CHUNKS, stream_ptr=stream)
    else:
        gpu.transfer_read_on_cuda(name, dev, buf.ctypes.data, N, stream_ptr=stream)
    queue_copy(fake_cuda, out.ctypes.data, dev, N, stream)  # after the read, on the stream
    assert fake_cuda.lib.cuStreamSynchronize(ctypes.c_void_p(stream)) == 0
    assert out.tobytes() == data.tobytes()


def test_on_cuda_with_the_default_stream_and_a_transport_hint(fake_cuda, pair):
    gpu, host, dev, buf, name = pair
    data = pattern(31, N)
    fake_cuda.upload(dev, data.tobytes())
    gpu.transfer_write_on_cuda(name, dev, buf.ctypes.data, N, 0, "rdma")
    assert buf.tobytes() == data.tobytes()
    gpu.batch_transfer_write_on_cuda(name, [], [], [], 0)  # nothing to move: no error


# ---- Refusals: RuntimeError, logged, in last_error() ------------------------------------
def test_on_cuda_refusals_raise_runtime_error_naming_why(fake_cuda, stream, pair, caplog):
    gpu, host, dev, buf, name = pair
    with pytest.raises(RuntimeError, match="1 buffers, 2 peer addresses and 1 lengths"):
        gpu.batch_transfer_write_on_cuda(name, [dev], [buf.ctypes.data, 0], [N], stream)
    assert gpu.last_error().startswith("batch_transfer_write_on_cuda: INVALID_ARGUMENT")
    port = free_port()  # a peer that does not answer
    with caplog.at_level(logging.ERROR, logger="ferry.mooncake"):
        with pytest.raises(RuntimeError, match=f"UNAVAILABLE.*{port}"):
            gpu.transfer_read_on_cuda(f"127.0.0.1:{port}", dev, 0, N, stream)
    assert any("transfer_read_on_cuda" in r.getMessage() for r in caplog.records)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_HANDLE"):
        gpu.transfer_write_on_cuda(name, dev, buf.ctypes.data, N, 0xdead0)  # not a stream
    assert "cuStreamSynchronize on CUDA stream 0xdead0" in gpu.last_error()
    idle = mc.TransferEngine()
    with pytest.raises(RuntimeError, match="not initialized"):
        idle.transfer_write_on_cuda(name, dev, buf.ctypes.data, N)


def test_on_cuda_without_a_gpu_refuses_naming_why(fake_cuda, monkeypatch):
    host = np.zeros(N, np.uint8)
    te = mc.TransferEngine()
    te.ferry_options = {"testing_cuda_driver": "/nonexistent/libcuda-for-test.so"}
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        assert te.register_memory(host.ctypes.data, N, "cpu:0") == 0
        name = f"127.0.0.1:{te.get_rpc_port()}"
        with pytest.raises(RuntimeError, match="no GPU here.*libcuda-for-test.so"):
            te.transfer_write_on_cuda(name, host.ctypes.data, host.ctypes.data, 16)
        assert "FAILED_PRECONDITION" in te.last_error()
    finally:
        te.close()
    # A driver whose cuInit finds no device (the fake answering as on a machine
    # without a GPU).
    lib = fake_cuda.lib
    lib.ferry_fake_cuda_set_init_result.argtypes = [ctypes.c_int]
    monkeypatch.setattr(mc, "_drivers", {})
    te = mc.TransferEngine()
    te.ferry_options = {"testing_cuda_driver": fake_cuda.path}
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        assert te.register_memory(host.ctypes.data, N, "cpu:0") == 0
        name = f"127.0.0.1:{te.get_rpc_port()}"
        lib.ferry_fake_cuda_set_init_result(CUDA_ERROR_NO_DEVICE)
        try:
            with pytest.raises(RuntimeError, match="no GPU here: cuInit .* failed: "
                                                   "CUDA_ERROR_NO_DEVICE"):
                te.batch_transfer_read_on_cuda(name, [host.ctypes.data], [host.ctypes.data], [16])
        finally:
            lib.ferry_fake_cuda_set_init_result(0)
        assert mc._drivers == {}  # a failure is not kept: the next call tries again
    finally:
        te.close()


# ---- The cuLaunchHostFunc path ------------------------------------------------------------
class HeldStream:
    """Stands in for the driver's cuLaunchHostFunc: keeps each host function
    queued until run() calls it from a thread of its own (the driver's)."""

    def __init__(self, result: int = 0):
        self.result = result
        self.queued = []

    def __call__(self, stream, fn, data) -> int:
        if self.result == 0:
            self.queued.append((stream.value or 0, fn, data))
        return self.result

    def run(self) -> None:
        stream, fn, data = self.queued.pop(0)
        thread = threading.Thread(target=fn, args=(data,))  # through the ctypes thunk
        thread.start()
        thread.join()


@pytest.fixture
def held(fake_cuda, monkeypatch):
    driver = mc._stream_driver(fake_cuda.path)
    stand_in = HeldStream()
    monkeypatch.setattr(driver, "launch_host_func", stand_in)
    return stand_in


def test_host_function_path_defers_the_transfer_to_the_stream(fake_cuda, stream, pair, held):
    gpu, host, dev, buf, name = pair
    data = pattern(41, N)
    fake_cuda.upload(dev, data.tobytes())
    gpu.batch_transfer_write_on_cuda(name, chunks(dev), chunks(buf.ctypes.data),
                                     [N // CHUNKS] * CHUNKS, stream)
    assert [q[0] for q in held.queued] == [stream]  # queued on the caller's stream
    assert not buf.any()  # returned at once: nothing moved before the stream got there
    held.run()
    assert buf.tobytes() == data.tobytes()
    assert mc._jobs == {}
    # A read, then the next transfer, in stream order.
    buf[:] = pattern(42, N)
    gpu.transfer_read_on_cuda(name, dev, buf.ctypes.data, N, stream)
    gpu.transfer_write_on_cuda(name, dev, buf.ctypes.data + N // 2, N // 2, stream)
    held.run()
    assert fake_cuda.download(dev, N) == pattern(42, N).tobytes()
    held.run()
    assert buf[N // 2:].tobytes() == pattern(42, N)[:N // 2].tobytes()


def test_a_failed_transfer_on_the_stream_ends_the_process(fake_cuda, stream, pair, held,
                                                          monkeypatch, caplog):
    """As in Mooncake (_exit(1)): the reason is logged first."""
    gpu, host, dev, buf, name = pair
    ended = []
    monkeypatch.setattr(mc, "_abort_process", lambda: ended.append(True))
    gpu.transfer_write_on_cuda(name, dev, buf.ctypes.data + 16, N, stream)  # runs past buf
    assert not ended
    with caplog.at_level(logging.CRITICAL, logger="ferry.mooncake"):
        held.run()
    assert ended == [True]
    assert gpu.last_error().startswith("transfer_write_on_cuda: ")
    assert any("ending the process" in r.getMessage() for r in caplog.records)


def test_a_refused_launch_raises_and_leaves_nothing_queued(fake_cuda, stream, pair, held):
    gpu, host, dev, buf, name = pair
    held.result = CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(RuntimeError, match="cuLaunchHostFunc on CUDA stream .* failed: "
                                           "CUDA_ERROR_INVALID_HANDLE"):
        gpu.transfer_write_on_cuda(name, dev, buf.ctypes.data, N, stream)
    assert mc._jobs == {} and held.queued == []
