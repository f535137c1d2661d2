"""A pool of registered host memory handed out in pieces (Mooncake's
"managed buffers").

Arenas are anonymous private mappings (pages are only backed once touched),
each registered with the engine as one region; allocations are carved from
them first-fit and coalesced when freed. Thread-safe.
"""

from __future__ import annotations

import bisect
import mmap
import threading

from . import _ferry
from ._errors import InvalidArgument, NotFound

_ALIGN = 256
_DEFAULT_ARENA = 256 << 20  # address space only; untouched pages cost nothing
_ARENA_GRANULE = 2 << 20


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _Arena:
    def __init__(self, size: int):
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.addr, self.size = _ferry.buffer_address(self.map, True)
        self.free = [(self.addr, self.size)]  # (start, size), sorted, never adjacent

    def allocate(self, size: int) -> int | None:
        for i, (start, free_size) in enumerate(self.free):
            if free_size >= size:
                if free_size == size:
                    del self.free[i]
                else:
                    self.free[i] = (start + size, free_size - size)
                return start
        return None

    def release(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self.free, (start, 0))
        end = start + size
        if i < len(self.free) and self.free[i][0] == end:  # merge with the next block
            end += self.free[i][1]
            del self.free[i]
        if i > 0 and sum(self.free[i - 1]) == start:  # merge with the previous block
            start = self.free[i - 1][0]
            del self.free[i - 1]
            i -= 1
        self.free.insert(i, (start, end - start))


class ManagedPool:
    """Registered memory for :meth:`allocate` / :meth:`free`, owned by one engine."""

    def __init__(self, engine, arena_size: int = _DEFAULT_ARENA):
        self._engine = engine
        self._arena_size = arena_size
        self._lock = threading.Lock()
        self._arenas: list[_Arena] = []
        self._allocated: dict[int, tuple[_Arena, int]] = {}  # address -> (arena, rounded size)

    def allocate(self, length: int) -> int:
        if length <= 0:
            raise InvalidArgument(f"cannot allocate a managed buffer of {length} bytes")
        size = _round_up(length, _ALIGN)
        with self._lock:
            for arena in self._arenas:
                addr = arena.allocate(size)
                if addr is not None:
                    break
            else:
                arena = _Arena(max(self._arena_size, _round_up(size, _ARENA_GRANULE)))
                self._engine.register(arena.map, location="cpu:0")
                self._arenas.append(arena)
                addr = arena.allocate(size)
            self._allocated[addr] = (arena, size)
            return addr

    def free(self, addr: int) -> None:
        with self._lock:
            entry = self._allocated.pop(addr, None)
            if entry is None:
                raise NotFound(f"{addr:#x} is not a managed buffer of this engine")
            arena, size = entry
            arena.release(addr, size)

    def size_of(self, addr: int) -> int | None:
        with self._lock:
            entry = self._allocated.get(addr)
            return None if entry is None else entry[1]
