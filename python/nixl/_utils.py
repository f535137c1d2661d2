"""nixl._utils: NIXL's test helpers for raw host buffers, with NIXL's names.

``malloc_passthru(size)`` returns the address of a new buffer aligned to 4096
bytes (what O_DIRECT storage I/O needs), ``free_passthru(addr)`` frees it,
``ba_buf(addr, size)`` fills it with 0xba, and ``verify_transfer(a, b, size)``
raises AssertionError if the two ranges differ (naming the first byte that
does). Addresses are plain ints, for descriptor tuples.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_ALIGN = 4096
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.aligned_alloc.restype = ctypes.c_void_p
_libc.aligned_alloc.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
_libc.free.restype = None
_libc.free.argtypes = (ctypes.c_void_p,)


def malloc_passthru(size: int) -> int:
    """A new 4096-byte-aligned buffer of `size` bytes (uninitialised)."""
    size = int(size)
    if size < 0:
        raise ValueError(f"malloc_passthru: size {size} is negative")
    rounded = max(_ALIGN, (size + _ALIGN - 1) // _ALIGN * _ALIGN)  # aligned_alloc's rule
    addr = _libc.aligned_alloc(_ALIGN, rounded)
    if not addr:
        raise MemoryError(f"malloc_passthru: cannot allocate {size} bytes")
    return int(addr)


def free_passthru(buf: int) -> None:
    """Frees a buffer of malloc_passthru."""
    _libc.free(ctypes.c_void_p(int(buf)))


def ba_buf(addr: int, size: int) -> None:
    """Fills `size` bytes at `addr` with 0xba."""
    ctypes.memset(int(addr), 0xBA, int(size))


def verify_transfer(addr1: int, addr2: int, size: int) -> None:
    """AssertionError if the `size` bytes at the two addresses differ."""
    a = ctypes.string_at(int(addr1), int(size))
    b = ctypes.string_at(int(addr2), int(size))
    if a != b:
        at = next(i for i in range(len(a)) if a[i] != b[i])
        raise AssertionError(f"verify_transfer: byte {at} differs ({a[at]:#x} != {b[at]:#x})")


__all__ = ["ba_buf", "free_passthru", "malloc_passthru", "verify_transfer"]
