"""A pool of registered host memory handed out in pieces (Mooncake's
"managed buffers").

Arenas are shared mappings of a memfd sealed against shrinking and growing
(pages are only backed once touched), so each buffer is registered with the
arena's descriptor and its offset in it: a peer on the same host maps the
buffer and copies with plain loads and stores, without a request to this
process ("Mapped segments" in docs/architecture.md). Where memfd is not
available, arenas are anonymous private mappings instead (logged once), and
peers' copies go through this engine. An arena only reserves address space:
it is never registered with the engine as a whole. Each buffer handed out is registered on its own, exactly
the ``length`` the caller asked for, and unregistered (which waits for
transfers still touching it) before its space goes back to the free list.
So a peer reaches exactly the buffers that are currently handed out (and
whatever the user registered), never the free space of an arena, another
buffer, or the alignment padding after a buffer: a transfer touching any of
those is refused by the target. Allocations are carved from the arenas
first-fit (in steps of 256 bytes) and coalesced when freed. Thread-safe.

Forked children: a shared mapping stays shared across fork(), so a child
writing into a managed buffer would write into its parent's (and, through
the parent's peers, into what they read). Right after os.fork() (also
multiprocessing's "fork" start method) the child maps every memfd arena
again, in place, as a private copy-on-write mapping of the same memfd: the
child starts with the buffers' bytes, and its writes stay its own, as with
the copy-on-write memory a fork gives any other buffer. One difference from
a snapshot: a page the child has not written yet shows what the parent
writes there later. Memory from Engine.allocate_shared is asked for as
shared and stays shared in children.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import mmap
import os
import threading
import weakref

from . import _ferry
from ._errors import FerryError, InvalidArgument, NotFound, ResourceExhausted

_ALIGN = 256
_DEFAULT_ARENA = 256 << 20  # address space only; untouched pages cost nothing
_ARENA_GRANULE = 2 << 20
_LOCATION = "cpu:0"

log = logging.getLogger("ferry")
_fallback_logged = False  # the memfd fallback is logged once per process


def _shared_file(size: int) -> int | None:
    """A memfd of ``size`` bytes sealed against shrinking and growing (what a
    same-host peer may map safely), or None where memfd is not available
    (logged once)."""
    global _fallback_logged
    fd = -1
    try:
        fd = os.memfd_create("ferry-managed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        return fd
    except (AttributeError, OSError) as e:
        if fd >= 0:
            os.close(fd)
        if not _fallback_logged:
            _fallback_logged = True
            reason = getattr(e, "strerror", None) or e
            log.warning("managed buffers: memfd is not available (%s); arenas are anonymous "
                        "memory, so same-host peers reach them through this engine instead of "
                        "mapping them", reason)
        return None


# The memfd arenas of every pool in this process, made private in a forked
# child (see the module docstring).
_shared_arenas: "weakref.WeakSet[_Arena]" = weakref.WeakSet()


def _privatize_arenas_in_child() -> None:
    for arena in list(_shared_arenas):
        try:
            _ferry.remap_private(arena.addr, arena.size, arena.fd)
        except OSError as e:
            log.warning("managed buffers: a forked child could not make its copy of an arena "
                        "private (%s); its writes to managed buffers reach the parent's",
                        e.strerror or e)


os.register_at_fork(after_in_child=_privatize_arenas_in_child)


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _Arena:
    """Address space to carve buffers from; not registered itself.

    ``fd``: the sealed memfd the arena maps from offset 0 (buffer offsets in
    the arena are file offsets), or None for anonymous memory. The arena owns
    it and closes it when it goes away (the engine keeps its own duplicate
    for each registered buffer)."""

    def __init__(self, size: int):
        self.fd = _shared_file(size)
        try:
            if self.fd is None:
                self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            else:
                self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED,
                                     prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            if self.fd is not None:
                os.close(self.fd)
            raise ResourceExhausted(f"cannot map an arena of {size} bytes for managed buffers: "
                                    f"{e.strerror or e}") from None
        if self.fd is not None:
            weakref.finalize(self, os.close, self.fd)
        self.view = memoryview(self.map)  # sliced per buffer; slices keep the mapping alive
        self.addr, self.size = _ferry.buffer_address(self.view, True)
        if self.fd is not None:
            _shared_arenas.add(self)
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
            self._engine.register(arena.piece(addr, length), location=_LOCATION, fd=arena.fd,
                                  fd_offset=addr - arena.addr)
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
