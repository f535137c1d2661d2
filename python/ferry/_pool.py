"""A pool of registered host memory handed out in pieces (Mooncake's
"managed buffers").

Arenas are anonymous private mappings (pages are only backed once touched)
that only reserve address space: an arena is never registered with the
engine as a whole. Each buffer handed out is registered on its own, exactly
the ``length`` the caller asked for, and unregistered (which waits for
transfers still touching it) before its space goes back to the free list.
So a peer reaches exactly the buffers that are currently handed out (and
whatever the user registered), never the free space of an arena, another
buffer, or the alignment padding after a buffer: a transfer touching any of
those is refused by the target. Allocations are carved from the arenas
first-fit (in steps of 256 bytes) and coalesced when freed. Thread-safe.
"""

from __future__ import annotations

import bisect
import mmap
import threading

from . import _ferry
from ._errors import FerryError, InvalidArgument, NotFound, ResourceExhausted

_ALIGN = 256
_DEFAULT_ARENA = 256 << 20  # address space only; untouched pages cost nothing
_ARENA_GRANULE = 2 << 20
_LOCATION = "cpu:0"


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _Arena:
    """Address space to carve buffers from; not registered itself."""

    def __init__(self, size: int):
        try:
            self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as e:
            raise ResourceExhausted(f"cannot map an arena of {size} bytes for managed buffers: "
                                    f"{e.strerror or e}") from None
        self.view = memoryview(self.map)  # sliced per buffer; slices keep the mapping alive
        self.addr, self.size = _ferry.buffer_address(self.view, True)
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

    def piece(self, addr: int, length: int) -> memoryview:
        """The bytes [addr, addr + length) of the arena, as a writable view."""
        offset = addr - self.addr
        return self.view[offset:offset + length]


class ManagedPool:
    """Registered memory for :meth:`allocate` / :meth:`free`, owned by one engine.

    Each allocation is its own registered region of exactly the requested
    length (the engine keeps the arena mapped while it is registered).
    """

    def __init__(self, engine, arena_size: int = _DEFAULT_ARENA):
        self._engine = engine
        self._arena_size = arena_size
        self._lock = threading.Lock()
        self._arenas: list[_Arena] = []
        # address -> (arena, rounded size carved from it, requested length = registered length)
        self._allocated: dict[int, tuple[_Arena, int, int]] = {}

    def allocate(self, length: int) -> int:
        """The address of a new buffer of ``length`` bytes, registered with the
        engine (exactly those bytes). Raises InvalidArgument for length <= 0,
        ResourceExhausted if no arena can be mapped, or the engine's error if
        registering fails (nothing is allocated then)."""
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
                self._arenas.append(arena)
                addr = arena.allocate(size)
        # Carved: neither free nor handed out yet, so no other call touches it while
        # it is registered (outside the lock: registration may take a while).
        try:
            self._engine.register(arena.piece(addr, length), location=_LOCATION)
        except BaseException:
            with self._lock:
                arena.release(addr, size)
            raise
        with self._lock:
            self._allocated[addr] = (arena, size, length)
        return addr

    def free(self, addr: int) -> None:
        """Unregisters the buffer at ``addr`` (waiting for transfers in flight
        that touch it) and returns its space to the pool. NotFound if ``addr``
        is not a buffer of this pool that is still allocated."""
        with self._lock:
            entry = self._allocated.pop(addr, None)
        if entry is None:
            raise NotFound(f"{addr:#x} is not a managed buffer of this engine")
        arena, size, _length = entry
        try:
            self._engine.unregister(addr)
        except FerryError as e:
            # NotFound: the caller unregistered it already; closed engine: nothing is
            # registered any more. Either way no peer reaches it. Otherwise it may still
            # be registered, so it stays out of the free list (and can be freed again).
            if not (isinstance(e, NotFound) or self._engine.closed):
                with self._lock:
                    self._allocated[addr] = entry
                raise
        with self._lock:
            arena.release(addr, size)

    def size_of(self, addr: int) -> int | None:
        """The length the buffer at ``addr`` was allocated with (what peers can
        reach), or None if it is not an allocated buffer of this pool."""
        with self._lock:
            entry = self._allocated.get(addr)
            return None if entry is None else entry[2]
