"""NIXL's descriptor lists (``nixl._bindings.nixlXferDList``, ``nixlRegDList``,
``nixlRemoteDList``) with NIXL's methods, stored as numpy rows so that lists
of millions of entries cost about a copy.

- ``nixlXferDList(type, descs)``: rows ``(addr, len, dev)``; Ferry also takes
  NIXL 1.5's strided rows ``(addr, len, dev, stride, count)`` as an (N, 5)
  array, each standing for ``count`` entries ``stride`` bytes apart
  (``descCount`` counts those entries).
- ``nixlRegDList(type, descs)``: rows ``(addr, len, dev, meta)``; ``meta`` is
  kept as bytes (``list[i]`` gives it as bytes, as NIXL does).
- ``nixlRemoteDList(type, descs)``: rows ``(addr, len, dev, agent_name)``.

Bad input raises what NIXL's native module raises: ``TypeError`` for a row
that is not a tuple, ``ValueError`` for a row or array of the wrong shape.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ._bindings import nixl_mem_t, nixlNotFoundError


def _mem(type_: Any) -> nixl_mem_t:
    if isinstance(type_, str) or isinstance(type_, bool):
        raise TypeError(f"a memory type is a nixl_mem_t (e.g. DRAM_SEG), not {type_!r}")
    return nixl_mem_t(int(type_))


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _rows_of_array(descs: np.ndarray, columns: tuple) -> np.ndarray:
    """A C-contiguous 64-bit integer view (or copy) of an (N, columns) array."""
    shape = " or ".join(f"Nx{c}" for c in columns)
    if descs.ndim != 2 or descs.shape[1] not in columns:
        raise ValueError(f"descs must be a {shape} numpy array, not of shape {descs.shape}")
    if descs.dtype.kind not in "iu":
        raise ValueError(f"descs must be a {shape} numpy array of uint64 or int64, not "
                         f"{descs.dtype}")
    if descs.dtype.kind == "i" and descs.size and int(descs.min()) < 0:
        raise ValueError("descs has negative values")
    if descs.dtype.itemsize == 8 and descs.flags.c_contiguous:
        return descs  # int64 / uint64 as given: Ferry reads both without a copy
    return np.ascontiguousarray(descs, dtype=np.uint64)


def _rows_of_tuples(descs, width: int, what: str) -> np.ndarray:
    """(N, 3) uint64 rows of the first three fields of `width`-tuples, in one
    numpy pass; the first bad row is named."""
    if not descs:
        return np.zeros((0, 3), np.uint64)
    head = [d[:3] if isinstance(d, tuple) and len(d) == width else None for d in descs]
    try:
        if any(h is None for h in head):
            raise ValueError
        arr = np.array(head)
        if arr.ndim != 2 or arr.dtype.kind not in "iu" or (arr.size and int(arr.min()) < 0):
            raise ValueError
    except (ValueError, TypeError, OverflowError):
        for i, d in enumerate(descs):
            if not isinstance(d, tuple):
                raise TypeError("Each descriptor must be a tuple when provided as a list "
                                f"(entry {i} is a {type(d).__name__})") from None
            if len(d) != width:
                raise ValueError(f"Each descriptor must be {what} (entry {i} has {len(d)} "
                                 "elements)") from None
            if not all(_is_int(v) and v >= 0 for v in d[:3]):
                raise ValueError(f"entry {i}: addr, len and dev must be non-negative ints, "
                                 f"not {d[:3]!r}") from None
        arr = np.array(head, dtype=np.uint64)  # ints numpy typed as objects (>= 2^63)
    return np.ascontiguousarray(arr, dtype=np.uint64)


def _strided_expand(rows: np.ndarray) -> np.ndarray:
    """(N, 3) rows of (N, 5) strided rows."""
    counts = rows[:, 4].astype(np.int64)
    base = np.repeat(rows[:, 0].astype(np.uint64), counts)
    step = np.repeat(rows[:, 3].astype(np.uint64), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    k = (np.arange(int(counts.sum()), dtype=np.int64) - first).astype(np.uint64)
    out = np.empty((base.shape[0], 3), np.uint64)
    out[:, 0] = base + k * step
    out[:, 1] = np.repeat(rows[:, 1].astype(np.uint64), counts)
    out[:, 2] = np.repeat(rows[:, 2].astype(np.uint64), counts)
    return out


class _DList:
    """What the three lists share: a memory type and (N, 3) rows."""

    _width = 3
    _what = "(addr, len, dev_id)"

    def __init__(self, type, descs=None, init_size: int = 0):  # noqa: A002 (NIXL's name)
        self._type = _mem(type)
        if isinstance(descs, numbers.Integral) and not isinstance(descs, bool):
            init_size, descs = int(descs), None  # nixlXferDList(type, init_size)
        self._rows = np.zeros((0, 3), np.uint64)
        self._extra: list = []  # per-row 4th field (reg: meta bytes; remote: agent name)
        if descs is None:
            if init_size:
                self._rows = np.zeros((int(init_size), 3), np.uint64)
                self._extra = [self._blank()] * int(init_size) if self._width == 4 else []
        elif isinstance(descs, np.ndarray):
            self._rows = _rows_of_array(descs, self._array_columns())
            self._extra = [self._blank()] * int(self._rows.shape[0]) if self._width == 4 else []
        elif isinstance(descs, (list, tuple)):
            self._rows = _rows_of_tuples(descs, self._width, self._what)
            self._extra = [self._field(d[3]) for d in descs] if self._width == 4 else []
        else:
            raise TypeError(f"descs must be a list of tuples or a numpy array, not "
                            f"{type(descs).__name__}")

    # Subclasses say what a 4th field is.
    @staticmethod
    def _array_columns() -> tuple:
        return (3,)

    @staticmethod
    def _blank():
        return None

    @staticmethod
    def _field(value):
        return None

    # ---- NIXL's methods -----------------------------------------------------------
    def getType(self) -> nixl_mem_t:
        return self._type

    def descCount(self) -> int:
        return int(self._rows.shape[0])

    def isEmpty(self) -> bool:
        return self.descCount() == 0

    def _plain(self) -> None:
        """Turns strided rows into plain ones before a change by index."""

    def _check_index(self, i: int) -> int:
        self._plain()
        n = self.descCount()
        i = int(i)
        if not 0 <= i < n:
            raise IndexError(f"descriptor index {i} out of range (the list has {n})")
        return i

    def _tuple(self, i: int) -> tuple:
        addr, length, dev = (int(v) for v in self._rows[i])
        if self._width == 3:
            return (addr, length, dev)
        return (addr, length, dev, self._extra[i])

    def _parse(self, desc) -> tuple:
        if not isinstance(desc, tuple):
            raise TypeError(f"a descriptor is a tuple {self._what}, not {type(desc).__name__}")
        if len(desc) != self._width or not all(_is_int(v) and v >= 0 for v in desc[:3]):
            raise ValueError(f"a descriptor is {self._what}, not {desc!r}")
        return (int(desc[0]), int(desc[1]), int(desc[2])), (
            self._field(desc[3]) if self._width == 4 else None)

    def __getitem__(self, i: int) -> tuple:
        return self._tuple(self._check_index(i))

    def __setitem__(self, i: int, desc) -> None:
        i = self._check_index(i)
        row, extra = self._parse(desc)
        if not self._rows.flags.writeable or self._rows.dtype != np.uint64:
            self._rows = np.array(self._rows, dtype=np.uint64)
        self._rows[i] = row
        if self._width == 4:
            self._extra[i] = extra

    def addDesc(self, desc) -> None:
        self._plain()
        row, extra = self._parse(desc)
        self._rows = np.concatenate([self._rows.astype(np.uint64, copy=False),
                                     np.array([row], dtype=np.uint64)])
        if self._width == 4:
            self._extra.append(extra)

    append = addDesc

    def remDesc(self, index: int) -> None:
        i = self._check_index(index)
        self._rows = np.delete(self._rows, i, axis=0)
        if self._extra:
            del self._extra[i]

    def clear(self) -> None:
        self._rows = np.zeros((0, 3), np.uint64)
        self._extra = []

    def print(self) -> None:
        print(repr(self))
        for i in range(min(self.descCount(), 64)):
            print(f"  {i}: {self._tuple(i)}")
        if self.descCount() > 64:
            print(f"  ... ({self.descCount() - 64} more)")

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        self._plain()
        other._plain()
        return (self._type == other._type and np.array_equal(self._rows, other._rows)
                and self._extra == other._extra)

    __hash__ = None  # mutable, as NIXL's

    def __bool__(self) -> bool:  # NIXL's lists are objects, always truthy
        return True

    def __getstate__(self):
        return (int(self._type), self._rows, self._extra)

    def __setstate__(self, state):
        mem, self._rows, self._extra = state
        self._type = nixl_mem_t(mem)

    def __repr__(self):
        return f"{type(self).__name__}({self._type.name}, {self.descCount()} descriptors)"

    # ---- What Ferry's agent reads ----------------------------------------------------
    @property
    def rows(self) -> np.ndarray:
        """The rows as Ferry's prepare() takes them: (N, 3), or (N, 5) strided."""
        return self._rows


class nixlXferDList(_DList):
    """A transfer descriptor list: (addr, len, dev_id) rows."""

    @staticmethod
    def _array_columns() -> tuple:
        return (3, 5)

    def descCount(self) -> int:
        if self._rows.shape[1] == 5:
            return int(self._rows[:, 4].astype(np.int64).sum())
        return int(self._rows.shape[0])

    def _plain(self) -> None:
        if self._rows.shape[1] == 5:
            self._rows = _strided_expand(self._rows)

    def index(self, desc) -> int:
        self._plain()
        row, _ = self._parse(desc)
        hits = np.flatnonzero((self._rows == np.array(row, dtype=self._rows.dtype)).all(axis=1))
        if hits.size == 0:
            raise nixlNotFoundError(f"descriptor {desc!r} is not in the list")
        return int(hits[0])

    def __getstate__(self):
        return (int(self._type), self._rows, None)

    def __setstate__(self, state):
        mem, self._rows, _ = state
        self._type = nixl_mem_t(mem)
        self._extra = []


class nixlRegDList(_DList):
    """A registration descriptor list: (addr, len, dev_id, meta) rows (meta:
    str or bytes, given back as bytes)."""

    _width = 4
    _what = "(addr, len, dev_id, meta_info)"

    @staticmethod
    def _blank():
        return b""

    @staticmethod
    def _field(value):
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"meta_info is str or bytes, not {type(value).__name__}")

    def index(self, desc) -> int:
        row, meta = self._parse(desc)
        for i in np.flatnonzero((self._rows == np.array(row, dtype=self._rows.dtype)).all(axis=1)):
            if self._extra[int(i)] == meta:
                return int(i)
        raise nixlNotFoundError(f"descriptor {desc!r} is not in the list")

    def trim(self) -> "nixlXferDList":
        """The same rows without their meta info, as a transfer list."""
        out = nixlXferDList(self._type)
        out._rows = self._rows
        return out

    def metas(self) -> list:
        """Each row's meta info (bytes)."""
        return list(self._extra)


class nixlRemoteDList(_DList):
    """A list of a remote agent's descriptors: (addr, len, dev_id, agent_name)."""

    _width = 4
    _what = "(addr, len, dev_id, agent_name)"

    @staticmethod
    def _blank():
        return ""

    @staticmethod
    def _field(value):
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, str):
            return value
        raise TypeError(f"agent_name is a str, not {type(value).__name__}")

    def __getstate__(self):
        return (int(self._type), self._rows, self._extra)
