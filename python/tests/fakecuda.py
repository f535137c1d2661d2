"""The tests' fake CUDA driver (tests/testing/fake_cuda_driver.cc, built as
<build>/libferry_fake_cuda.so) driven from Python through ctypes.

Device memory of the fake is PROT_NONE to the CPU: it is filled and read only
through the fake's own calls (cuMemcpyAsync on the default stream plus
cuStreamSynchronize, cuMemsetD8_v2). An engine made with
``testing_cuda_driver=<the same path>`` dlopens the same copy of the library,
so allocations made here are the engine's driver's device memory.

The library is found at $FERRY_FAKE_CUDA_PATH, else next to the build tree the
``ferry`` package was imported from (<build>/python/ferry -> <build>).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

LIBRARY = "libferry_fake_cuda.so"


def find_library() -> tuple[str | None, str]:
    """(path, "") of the fake driver, or (None, why it was not found)."""
    env = os.environ.get("FERRY_FAKE_CUDA_PATH")
    if env:
        if Path(env).is_file():
            return str(Path(env).resolve()), ""
        return None, f"FERRY_FAKE_CUDA_PATH={env} is not a file"
    import ferry

    build = Path(ferry.__file__).resolve().parent.parent.parent  # <build>/python/ferry
    path = build / LIBRARY
    if path.is_file():
        return str(path), ""
    return None, (f"no {LIBRARY} in {build} (build the target ferry_fake_cuda there, or set "
                  "FERRY_FAKE_CUDA_PATH)")


class FakeCuda:
    """A handle on the fake driver, with a context of device 0 current on the
    thread that made it (the fake's contexts are per thread)."""

    def __init__(self, path: str):
        self.path = path
        lib = ctypes.CDLL(path)
        self.lib = lib
        u64, size, vp = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        lib.cuCtxPushCurrent_v2.argtypes = [vp]
        lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(vp)]
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size]
        lib.cuMemFree_v2.argtypes = [u64]
        lib.cuMemcpyAsync.argtypes = [u64, u64, size, vp]
        lib.cuStreamSynchronize.argtypes = [vp]
        lib.cuMemsetD8_v2.argtypes = [u64, ctypes.c_ubyte, size]
        lib.ferry_fake_cuda_copied_bytes.argtypes = [ctypes.c_int]
        lib.ferry_fake_cuda_copied_bytes.restype = u64
        lib.ferry_fake_cuda_live_allocations.argtypes = [ctypes.c_int]
        self._check(lib.cuInit(0), "cuInit")
        self._contexts = []
        self.push(0)

    @staticmethod
    def _check(result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"fake CUDA driver: {call} returned CUresult {result}")

    def push(self, device: int) -> None:
        """Makes device's primary context current on this thread."""
        ctx = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device),
                    "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent_v2")
        self._contexts.append(ctx)

    def pop(self) -> None:
        ctx = ctypes.c_void_p()
        self._check(self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctx)), "cuCtxPopCurrent_v2")
        self._contexts.pop()

    def alloc(self, nbytes: int) -> int:
        """Device memory of the current context's device."""
        ptr = ctypes.c_ulonglong(0)
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), "cuMemAlloc_v2")
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        self._check(self.lib.cuMemFree_v2(ptr), "cuMemFree_v2")

    def _copy(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self.lib.cuMemcpyAsync(dst, src, nbytes, None), "cuMemcpyAsync")
        self._check(self.lib.cuStreamSynchronize(None), "cuStreamSynchronize")

    def upload(self, dptr: int, data: bytes) -> None:
        """Copies host bytes into device memory (and waits)."""
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self._copy(dptr, ctypes.addressof(buf), len(data))

    def download(self, dptr: int, nbytes: int) -> bytes:
        """Device memory's bytes, copied to the host (waits)."""
        buf = ctypes.create_string_buffer(nbytes)
        self._copy(ctypes.addressof(buf), dptr, nbytes)
        return buf.raw

    def memset(self, dptr: int, value: int, nbytes: int) -> None:
        self._check(self.lib.cuMemsetD8_v2(dptr, value, nbytes), "cuMemsetD8_v2")

    def copied(self, direction: int) -> int:
        """Bytes the fake copied so far: 0 host to device, 1 device to host,
        2 device to device, 3 host to host."""
        return int(self.lib.ferry_fake_cuda_copied_bytes(direction))

    def live_allocations(self) -> int:
        return int(self.lib.ferry_fake_cuda_live_allocations(0))

    def close(self) -> None:
        while self._contexts:
            self.pop()


class FakeDevice:
    """torch.device("cuda", index) as ferry and the drop-ins see it."""

    type = "cuda"

    def __init__(self, index: int = 0):
        self.index = index

    def __str__(self):
        return f"cuda:{self.index}"


class FakeCudaTensor:
    """What a contiguous torch CUDA tensor of uint8 looks like to ferry and nixl."""

    def __init__(self, ptr: int, nbytes: int, device: int = 0):
        self._ptr = ptr
        self._nbytes = nbytes
        self.device = FakeDevice(device)

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return self._nbytes

    def element_size(self) -> int:
        return 1

    def is_contiguous(self) -> bool:
        return True
