"""FILE memory of Ferry's NIXL agent (the ``POSIX`` backend).

NIXL names file bytes by rows ``(offset, length, fd)`` (registration rows
add a meta field, which may hold the file's path); Ferry registers a range
of a file as a region of the memory kind ``file`` and names its bytes by an
address: ``base + k`` stands for file offset ``offset + k``
(``ferry.Engine.register_file``, docs/architecture.md "Memory kinds: file").
This module keeps the agent's file registrations and turns NIXL's rows into
Ferry's addresses, all rows of a list in a few numpy passes.

The bytes move through the engine's io_uring ring between the agent's host
memory and its own files (a transfer to the agent's own name, as NIXL's
POSIX examples do). GPU memory to or from files (NIXL's ``GDS`` backends)
is refused, naming why.
"""

from __future__ import annotations

import ctypes.util
import fcntl
import os
import threading

import numpy as np

import ferry

from ._bindings import nixlInvalidParamError, nixlNotSupportedError

GDS_PLUGINS = ("GDS", "GDS_MT")


def gds_refusal(plugin: str) -> str:
    """Why this agent has no ``GDS`` / ``GDS_MT`` backend (GPUDirect Storage
    through NVIDIA's cuFile)."""
    if ctypes.util.find_library("cufile") is None:
        why = "NVIDIA cuFile (libcufile.so.0) is not installed on this machine"
    else:
        why = "Ferry's agent does not drive cuFile"
    return (f"plugin {plugin!r} (GPUDirect Storage) needs cuFile and a GPU, and {why}; the "
            "POSIX backend moves FILE memory through host memory (io_uring)")


class FileRegistrations:
    """The agent's registered file ranges, by descriptor. Thread-safe."""

    def __init__(self, engine: ferry.Engine):
        self._engine = engine
        self._lock = threading.Lock()
        # fd -> [(file offset, length, base address)], sorted by offset
        self._by_fd: dict[int, list[tuple[int, int, int]]] = {}

    def register(self, rows: np.ndarray, metas: list) -> int:
        """Registers each row (offset, length, fd) with its meta (a path used
        when fd is 0 and the meta names a file). All or nothing. Returns the
        bytes registered."""
        done: list[tuple[int, int]] = []  # (fd, base) to undo on failure
        total = 0
        try:
            for i in range(rows.shape[0]):
                offset, length, fd = (int(v) for v in rows[i, :3])
                meta = metas[i] if i < len(metas) else b""
                path = meta.decode("utf-8", "surrogateescape") if meta else ""
                target = path if fd == 0 and path else fd
                writable = self._writable(target, i)
                base = self._engine.register_file(target, offset=offset,
                                                  length=length or None, writable=writable)
                if not length:  # to the end of the file: its size now
                    length = os.stat(target).st_size - offset
                done.append((fd, base))
                with self._lock:
                    regions = self._by_fd.setdefault(fd, [])
                    regions.append((offset, length, base))
                    regions.sort()
                total += length
        except BaseException:
            for fd, base in done:
                self._forget(fd, base)
            raise
        return total

    @staticmethod
    def _writable(target: int | str, row: int) -> bool:
        """Whether the file may be written: the descriptor's access mode (a
        path: the caller's permission)."""
        try:
            if isinstance(target, str):
                return os.access(target, os.W_OK)
            return fcntl.fcntl(target, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
        except OSError as e:
            raise nixlInvalidParamError(f"FILE row {row}: descriptor {target} is not open "
                                        f"({e.strerror})") from e

    def _forget(self, fd: int, base: int) -> None:
        try:
            self._engine.unregister(base)
        except ferry.FerryError:
            pass
        with self._lock:
            regions = self._by_fd.get(fd, [])
            regions[:] = [r for r in regions if r[2] != base]

    def unregister(self, rows: np.ndarray) -> int:
        """Unregisters the ranges registered at each row's (offset, fd);
        returns the bytes freed. An unknown row raises after the others."""
        freed, missing = 0, None
        for i in range(rows.shape[0]):
            offset, _, fd = (int(v) for v in rows[i, :3])
            with self._lock:
                found = next((r for r in self._by_fd.get(fd, []) if r[0] == offset), None)
            if found is None:
                missing = missing if missing is not None else i
                continue
            self._forget(fd, found[2])
            freed += found[1]
        if missing is not None:
            raise nixlInvalidParamError(f"deregisterMem: FILE row {missing} (offset "
                                        f"{int(rows[missing, 0])}, fd {int(rows[missing, 2])}) "
                                        "is not a registered file range")
        return freed

    def addresses(self, rows: np.ndarray) -> np.ndarray:
        """Ferry's rows for NIXL's FILE rows: (addr, len, 0), or (addr, len,
        0, stride, count) for strided rows. A row outside every registered
        range of its descriptor is named."""
        out = np.array(rows, dtype=np.uint64, copy=True)
        if out.shape[0] == 0:
            return out
        offsets = out[:, 0].astype(np.uint64)
        ends = offsets + out[:, 1].astype(np.uint64)
        if out.shape[1] == 5:  # the last entry of a strided row ends furthest
            ends = ends + out[:, 3] * (np.maximum(out[:, 4], 1) - 1)
        fds = out[:, 2]
        with self._lock:
            table = {fd: list(regions) for fd, regions in self._by_fd.items()}
        for fd in np.unique(fds):
            pick = np.flatnonzero(fds == fd)
            regions = table.get(int(fd), [])
            if not regions:
                raise nixlInvalidParamError(f"FILE row {int(pick[0])}: descriptor {int(fd)} has "
                                            "no registered range (registerMem it first)")
            starts = np.array([r[0] for r in regions], dtype=np.uint64)
            limits = starts + np.array([r[1] for r in regions], dtype=np.uint64)
            bases = np.array([r[2] for r in regions], dtype=np.uint64)
            at = np.searchsorted(starts, offsets[pick], side="right") - 1
            ok = (at >= 0) & (ends[pick] <= limits[np.maximum(at, 0)])
            if not ok.all():
                row = int(pick[np.flatnonzero(~ok)[0]])
                raise nixlInvalidParamError(
                    f"FILE row {row} (offset {int(offsets[row])}, length {int(out[row, 1])}, fd "
                    f"{int(fd)}) lies outside the ranges registered for that descriptor")
            out[pick, 0] = bases[at] + (offsets[pick] - starts[at])
            out[pick, 2] = 0
        return out

    def close(self) -> None:
        with self._lock:
            self._by_fd.clear()


def refuse_remote_files(agent_name: str) -> None:
    raise nixlNotSupportedError(
        f"FILE memory of agent {agent_name!r}: the POSIX backend moves an agent's own files "
        "(a transfer to its own name); another agent's files are out of reach")
