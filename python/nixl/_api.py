"""nixl._api: NVIDIA NIXL's agent API (``nixl_agent``, ``nixl_agent_config``)
on Ferry, for vLLM's NixlConnector and SGLang's nixl backend.

One ``ferry.Engine`` per agent (its local name is the agent's name; it
listens on 127.0.0.1 unless FERRY_* settings or ``listen_port`` say
otherwise). Backends ``UCX``, ``LIBFABRIC`` and ``FERRY`` all map onto Ferry's
transport ``auto``: per peer, the first of ``local`` (within a process),
``cuda_ipc`` (a peer's GPU memory on the same host), ``shm`` (the same host),
``fabric`` (libfabric RMA, where a hardware provider such as verbs, efa or cxi
is found or FERRY_FABRIC_PROVIDER names one) and ``tcp`` that reaches the peer
and both memory kinds (``ferry info`` lists them in this order).

Memory: ``DRAM`` (alias ``cpu``) and ``VRAM`` (aliases ``CUDA``, ``GPU``):
each row of a VRAM registration list is registered as Ferry location
``cuda:{dev_id}`` (its third column; CUDA tensors give their device index),
checked against the CUDA driver (no driver, or a range that is not that
device's memory, fails the whole list). Transfers take VRAM lists like DRAM
ones; the path follows from the registrations of both sides:
- the peer's VRAM, same host (another process): ``cuda_ipc`` (CUDA IPC
  handles, from local DRAM or VRAM), else ``tcp`` (the peer's side stages
  its GPU memory through host buffers). ``shm`` and ``fabric`` do not reach
  a peer's VRAM: a route that has only those is refused (nixlBackendError
  naming the memory kinds).
- local VRAM with the peer's DRAM: staged through page-locked host buffers
  over ``shm``, ``tcp`` or ``fabric``.
- two agents of one process: the ``local`` transport moves host memory only
  and CUDA IPC does not open a process's own handles, so GPU memory between
  them takes shm (local VRAM only) or tcp.
BLK, OBJ and FILE raise nixlNotSupportedError.

Differences from upstream NIXL 1.5 (none that vLLM or SGLang rely on):
- Metadata bytes are Ferry's (``get_agent_metadata``): they load into this
  drop-in only, not into upstream NIXL agents.
- Adjacent entries are always merged; ``skip_desc_merge`` is accepted and
  ignored (``descCount`` counts merged requests).
- A transfer list's ``mem_type`` is not matched against the registrations:
  each entry's memory kind is the one its region was registered with.
- A prepared remote list is bound to the peer instance it was checked
  against: after the peer restarted (same address, new process), using it
  raises nixlNotFoundError saying so -- load the new metadata and prepare
  again. A peer that died raises nixlRemoteDisconnectError (Ferry's
  UNAVAILABLE); a transfer that timed out while the peer is still reachable
  raises nixlBackendError (DEADLINE_EXCEEDED).
- ``transfer`` / ``check_xfer_state`` never return "ERR": failures are
  exceptions (callers that check for "ERR" handle exceptions too).
- Releasing a transfer in flight cancels it: once ``release_xfer_handle``
  returns, none of its bytes land in local memory any more.
"""

from __future__ import annotations

import logging
import numbers
import struct
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

import ferry

from . import _bindings as nixlBind  # noqa: F401  (callers import nixl._api.nixlBind)
from ._bindings import (DEFAULT_COMM_PORT, NIXL_INIT_AGENT, nixlBackendError, nixlCancelledError,
                        nixlInvalidParamError, nixlMismatchError, nixlNoTelemetryError,
                        nixlNotFoundError, nixlNotPostedError, nixlNotSupportedError,
                        nixlRemoteDisconnectError, nixlRepostActiveError, nixlXferTelemetry)

log = logging.getLogger("nixl")

# Backend names accepted (all run on Ferry's transport "auto").
PLUGINS = ("UCX", "LIBFABRIC", "FERRY")
_HOST_MEM = {"DRAM": "DRAM", "CPU": "DRAM"}
_GPU_MEM = {"VRAM": "VRAM", "CUDA": "VRAM", "GPU": "VRAM"}
_OTHER_MEM = {"BLK", "OBJ", "FILE"}
MEM_TYPES = ["DRAM", "VRAM"]  # what every backend serves

# Metadata envelope: magic, then u32-length-prefixed agent name and peer id,
# then Ferry's exported metadata.
_MAGIC = b"FERRY-NIXL\x01"


def _mem_type(mem_type: str | None, default: str = "DRAM") -> str:
    """The canonical memory type ("DRAM", "VRAM"), or raises for what is not served."""
    if mem_type is None:
        return default
    name = str(mem_type).upper()
    if name in _HOST_MEM:
        return _HOST_MEM[name]
    if name in _GPU_MEM:
        return _GPU_MEM[name]
    if name in _OTHER_MEM:
        raise nixlNotSupportedError(f"memory type {mem_type!r} is not supported; DRAM or VRAM")
    raise nixlInvalidParamError(f"unknown memory type {mem_type!r}: DRAM (or cpu), VRAM (or "
                                "cuda, gpu), BLK, OBJ, FILE")


def _locations(dlist: "nixlRegDList") -> list:
    """Ferry's location of each row of a registration list: "cpu" for DRAM,
    "cuda:{dev_id}" for VRAM."""
    if dlist.mem_type == "VRAM":
        return [f"cuda:{int(dev)}" for dev in dlist.rows[:, 2]]
    return ["cpu"] * len(dlist)


def _translate(error: ferry.FerryError) -> Exception:
    """The NIXL exception for a Ferry error (Ferry's message kept)."""
    text = str(error)
    name = error.code_name
    if name == "NOT_FOUND":
        cls = nixlNotFoundError
    elif name == "INVALID_ARGUMENT":
        cls = nixlInvalidParamError
    elif name == "UNAVAILABLE":
        cls = nixlRemoteDisconnectError
    elif name == "CANCELLED":
        cls = nixlCancelledError
    elif name == "UNIMPLEMENTED":
        cls = nixlNotSupportedError
    elif name == "FAILED_PRECONDITION":
        lowered = text.lower()
        if "still in flight" in lowered:
            cls = nixlRepostActiveError
        elif "restarted" in lowered or "was closed" in lowered:
            cls = nixlNotFoundError  # load the peer's (new) metadata and prepare again
        elif "never posted" in lowered:
            cls = nixlNotPostedError
        elif ("wire protocol version" in lowered or "descriptor format" in lowered
              or "capability" in lowered or "takes notification messages" in lowered):
            cls = nixlMismatchError  # the peer's build cannot serve this
        else:
            cls = nixlBackendError
    else:  # DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ALREADY_EXISTS, INTERNAL, ...
        cls = nixlBackendError
    exc = cls(text)
    exc.__cause__ = error
    return exc


def _name(agent: Any) -> str:
    """An agent name given as str or bytes (add_remote_agent returns bytes)."""
    if isinstance(agent, (bytes, bytearray, memoryview)):
        return bytes(agent).decode("utf-8", "surrogateescape")
    if isinstance(agent, str):
        return agent
    raise nixlInvalidParamError(f"an agent name is str or bytes, not {type(agent).__name__}")


def _message(msg: Any) -> bytes:
    if isinstance(msg, str):
        return msg.encode()
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    raise nixlInvalidParamError(f"a notification message is bytes or str, not {type(msg).__name__}")


class nixl_agent_config:
    """Agent settings, with NIXL's argument names and defaults.

    ``backends`` are instantiated when the agent is made (each must be one of
    UCX, LIBFABRIC, FERRY). ``enable_listen_thread=True`` makes the agent's
    engine listen on ``listen_port`` (else any free port). ``num_threads``,
    ``enable_prog_thread`` and ``sync_mode`` are accepted and ignored (Ferry's
    engine runs its own threads; FERRY_IO_THREADS sets them).
    ``capture_telemetry=True`` enables get_xfer_telemetry.

    Ferry extension (not in upstream NIXL): ``conf.ferry_options = {...}``
    passes ferry.Engine options (e.g. ``{"transfer_timeout": 2.0}``) to the
    agent's engine; they win over FERRY_* settings, which Ferry reads once per
    process.
    """

    def __init__(self, enable_prog_thread: bool = True, enable_listen_thread: bool = False,
                 listen_port: int = DEFAULT_COMM_PORT, capture_telemetry: bool = False,
                 num_threads: int = 0, backends: list | None = None, sync_mode=None):
        self.enable_pthread = bool(enable_prog_thread)
        self.enable_listen = bool(enable_listen_thread)
        self.port = int(listen_port)
        self.capture_telemetry = bool(capture_telemetry)
        self.num_threads = int(num_threads)
        self.backends = ["UCX"] if backends is None else list(backends)
        self.sync_mode = sync_mode
        self.ferry_options: dict = {}

    def __repr__(self):
        return (f"nixl_agent_config(backends={self.backends!r}, capture_telemetry="
                f"{self.capture_telemetry}, listen={self.enable_listen}:{self.port})")


class nixlRegDList:
    """A registration descriptor list (get_reg_descs): rows (addr, len, dev),
    a memory type and per-row meta strings. Picklable, always truthy."""

    __slots__ = ("rows", "mem_type", "metas")

    def __init__(self, rows: np.ndarray, mem_type: str, metas: list | None = None):
        self.rows = rows  # (N, 3) uint64, C-contiguous
        self.mem_type = mem_type
        self.metas = metas

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __bool__(self) -> bool:
        return True

    def __getstate__(self):
        return (self.rows, self.mem_type, self.metas)

    def __setstate__(self, state):
        self.rows, self.mem_type, self.metas = state

    def __repr__(self):
        return f"<nixlRegDList {self.mem_type} rows={len(self)}>"


class nixlXferDList:
    """A transfer descriptor list (get_xfer_descs): (N, 3) rows (addr, len,
    dev) or (N, 5) rows (addr, len, dev, stride, count). Picklable, truthy."""

    __slots__ = ("rows", "mem_type")

    def __init__(self, rows: np.ndarray, mem_type: str):
        self.rows = rows
        self.mem_type = mem_type

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __bool__(self) -> bool:
        return True

    def __getstate__(self):
        return (self.rows, self.mem_type)

    def __setstate__(self, state):
        self.rows, self.mem_type = state

    def __repr__(self):
        return f"<nixlXferDList {self.mem_type} rows={len(self)} columns={self.rows.shape[1]}>"


class _Remote:
    """A loaded remote agent: its Ferry segment and whether it is still usable."""

    __slots__ = ("name", "peer_id", "segment", "removed", "disconnected")

    def __init__(self, name: str, peer_id: str, segment: ferry.Segment):
        self.name = name
        self.peer_id = peer_id
        self.segment = segment
        self.removed = False
        self.disconnected = False


class nixlPrepDlistHandle:
    """A prepared descriptor list (prep_xfer_dlist). Opaque, truthy, hashable
    by identity."""

    __slots__ = ("dlist", "remote", "agent_name", "__weakref__")

    def __init__(self, dlist: ferry.DescList, remote: _Remote | None, agent_name: str):
        self.dlist = dlist
        self.remote = remote  # None: local
        self.agent_name = agent_name

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self.dlist)

    def __repr__(self):
        return f"<nixlPrepDlistHandle {self.agent_name or 'local'} entries={len(self.dlist)}>"


class nixlXferHandle:
    """A transfer (make_prepped_xfer / initialize_xfer). Opaque, truthy,
    hashable by identity; dropping it unreleased is safe (it is cancelled
    and released when collected)."""

    __slots__ = ("transfer", "remote", "op", "posted", "__weakref__")

    def __init__(self, transfer: ferry.Transfer, remote: _Remote, op: str):
        self.transfer = transfer
        self.remote = remote
        self.op = op
        self.posted = False

    def __bool__(self) -> bool:
        return True

    def __repr__(self):
        return f"<nixlXferHandle {self.op} {self.remote.name}>"


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _tensor_row(t: Any) -> tuple[tuple, str]:
    """((addr, nbytes, dev), mem type) of a tensor-like object: host memory
    is DRAM (dev 0), a CUDA tensor VRAM with its device index."""
    device = getattr(t, "device", None)
    kind = getattr(device, "type", str(device)) if device is not None else "cpu"
    if kind not in ("cpu", "cuda"):
        raise nixlNotSupportedError(f"a tensor on {device}: only host (DRAM) and CUDA (VRAM) "
                                    "memory are supported")
    is_contiguous = getattr(t, "is_contiguous", None)
    if callable(is_contiguous) and not is_contiguous():
        raise nixlInvalidParamError("a tensor that is not contiguous")
    nbytes = int(t.numel()) * int(t.element_size())
    if kind == "cuda":
        index = getattr(device, "index", None)
        return (int(t.data_ptr()), nbytes, 0 if index is None else int(index)), "VRAM"
    return (int(t.data_ptr()), nbytes, 0), "DRAM"


def _tensor_rows(tensors) -> tuple[list, str]:
    """Rows and the one memory type of a list of tensors (mixing host and
    CUDA tensors in one list is refused)."""
    rows = [_tensor_row(t) for t in tensors]
    kinds = {k for _r, k in rows}
    if len(kinds) > 1:
        raise nixlInvalidParamError("a list of tensors in both host (DRAM) and CUDA (VRAM) "
                                    "memory: make one list per memory type")
    return [r for r, _k in rows], rows[0][1]


def _rows_from_array(descs: np.ndarray, columns: tuple) -> np.ndarray:
    """A C-contiguous uint64 copy/view of an integer row array, checked."""
    if descs.ndim != 2 or descs.shape[1] not in columns:
        raise nixlInvalidParamError(
            f"an array of shape {descs.shape}: expected (N, {' or '.join(map(str, columns))})")
    if descs.dtype.kind not in "iu":
        raise nixlInvalidParamError(f"an array of dtype {descs.dtype}: expected integers")
    if descs.dtype.kind == "i" and descs.size and int(descs.min()) < 0:
        raise nixlInvalidParamError("an array with negative values")
    if descs.dtype.itemsize == 8 and descs.flags.c_contiguous:
        rows = descs  # int64 / uint64 as they are: Ferry reads both (no copy)
    else:
        rows = np.ascontiguousarray(descs, dtype=np.uint64)
    if rows.shape[0] and not rows[:, 1].all():
        bad = int(np.flatnonzero(rows[:, 1] == 0)[0])
        raise nixlInvalidParamError(f"row {bad} has length 0")
    if rows.shape[1] == 5 and rows.shape[0] and not rows[:, 4].all():
        bad = int(np.flatnonzero(rows[:, 4] == 0)[0])
        raise nixlInvalidParamError(f"row {bad} has count 0")
    return rows


def _rows_from_tuples(descs: list, columns: tuple) -> np.ndarray:
    """Rows of a list of int tuples, converted by numpy in one pass (no
    Python loop per row); anything but equally long rows of ints is refused."""
    expected = " or ".join(map(str, columns))
    try:
        arr = np.array(descs)
    except (ValueError, TypeError, OverflowError):  # ragged rows, huge ints
        arr = None
    if arr is None or arr.ndim != 2 or arr.dtype.kind not in "iu" or arr.shape[1] not in columns:
        for i, row in enumerate(descs):  # name the first bad row
            if (not isinstance(row, (tuple, list)) or len(row) not in columns
                    or not all(_is_int(v) for v in row)):
                raise nixlInvalidParamError(f"row {i} is {row!r}: expected a tuple of {expected} "
                                            "non-negative ints")
        try:  # ints, but numpy did not find one type for them (e.g. >= 2^63)
            arr = np.array(descs, dtype=np.uint64)
        except (ValueError, TypeError, OverflowError):
            raise nixlInvalidParamError(
                f"rows must be tuples of {expected} non-negative ints below 2^64") from None
    return _rows_from_array(arr, columns)


class nixl_agent:
    """A NIXL agent on a Ferry engine; see the module docstring.

    Every method is thread-safe; calls that wait or move data release the GIL.
    """

    def __init__(self, agent_name: str, nixl_conf: nixl_agent_config | None = None,
                 instantiate_all: bool = False):
        if not isinstance(agent_name, str) or not agent_name:
            raise nixlInvalidParamError("agent_name must be a non-empty str")
        conf = nixl_conf if nixl_conf is not None else nixl_agent_config()
        for backend in conf.backends:
            self._check_plugin(backend)
        self.name = agent_name
        self.conf = conf
        self.plugin_list = list(PLUGINS)
        self.backends: dict[str, Any] = {}
        self.backend_mems: dict[str, list] = {}
        self.notifs: dict[str, list] = {}
        self._capture_telemetry = conf.capture_telemetry
        self._lock = threading.Lock()
        self._remotes: dict[str, _Remote] = {}
        self._registered: dict[int, int] = {}  # addr -> length
        options: dict[str, Any] = {"local_name": agent_name}
        if conf.enable_listen:
            options["listen_port"] = conf.port
        options.update(getattr(conf, "ferry_options", None) or {})
        try:
            self._engine = ferry.Engine(**options)
        except ferry.FerryError as e:
            raise _translate(e) from e
        for backend in (PLUGINS if instantiate_all else conf.backends):
            self.create_backend(backend)

    # ---- Backends -----------------------------------------------------------------
    @staticmethod
    def _check_plugin(name: str) -> None:
        if name not in PLUGINS:
            raise nixlNotFoundError(f"backend {name!r} does not exist here; available: "
                                    f"{', '.join(PLUGINS)} (all run on Ferry's transports)")

    def get_plugin_list(self) -> list:
        return list(PLUGINS)

    def get_plugin_mem_types(self, backend: str) -> list:
        self._check_plugin(backend)
        return list(MEM_TYPES)

    def get_plugin_params(self, backend: str) -> dict:
        self._check_plugin(backend)
        return {}

    def get_backend_mem_types(self, backend: str) -> list:
        return self.get_plugin_mem_types(backend)

    def get_backend_params(self, backend: str) -> dict:
        return self.get_plugin_params(backend)

    def create_backend(self, backend: str, initParams: dict | None = None) -> None:
        """Instantiates a backend (UCX, LIBFABRIC or FERRY: Ferry's transport
        auto); anything else raises nixlNotFoundError listing what exists."""
        self._check_plugin(backend)
        with self._lock:
            self.backends.setdefault(backend, _Backend(backend, dict(initParams or {})))
            self.backend_mems[backend] = list(MEM_TYPES)

    def _check_backends(self, backends) -> None:
        """``backends=[...]`` of a call: each must exist and be created."""
        for backend in backends or ():
            self._check_plugin(backend)
            if backend not in self.backends:
                created = ", ".join(self.backends) or "none"
                raise nixlNotFoundError(f"backend {backend!r} was not created on agent "
                                        f"{self.name!r} (created: {created})")

    # ---- Descriptor lists ---------------------------------------------------------
    def get_reg_descs(self, descs, mem_type: str | None = None, is_sorted: bool = False):
        """A registration list from (addr, len, dev, meta) tuples, an (N, 3)
        integer array, a tensor or a list of tensors, or a ready list.
        Returns None (logging why) on bad input."""
        try:
            return self._reg_descs(descs, mem_type)
        except (nixlInvalidParamError, nixlNotSupportedError) as e:
            log.error("get_reg_descs: %s", e)
            return None

    def _reg_descs(self, descs, mem_type) -> nixlRegDList:
        if isinstance(descs, nixlRegDList):
            if mem_type is not None and _mem_type(mem_type) != descs.mem_type:
                raise nixlInvalidParamError(f"a {descs.mem_type} list given as {mem_type}")
            return descs
        if isinstance(descs, np.ndarray):
            return nixlRegDList(_rows_from_array(descs, (3,)), _mem_type(mem_type))
        if callable(getattr(descs, "data_ptr", None)):
            row, kind = _tensor_row(descs)
            return nixlRegDList(np.array([row], dtype=np.uint64), _mem_type(mem_type, kind), [""])
        if isinstance(descs, (list, tuple)):
            if descs and all(callable(getattr(d, "data_ptr", None)) for d in descs):
                rows, kind = _tensor_rows(descs)
                return nixlRegDList(np.array(rows, dtype=np.uint64), _mem_type(mem_type, kind),
                                    [""] * len(rows))
            metas, plain = [], []
            for i, row in enumerate(descs):
                if isinstance(row, (tuple, list)) and len(row) == 4:
                    meta = row[3]
                    if not isinstance(meta, (str, bytes)):
                        raise nixlInvalidParamError(f"row {i}: the meta field is not a str")
                    metas.append(meta)
                    plain.append(tuple(row[:3]))
                else:
                    metas.append("")
                    plain.append(row)
            return nixlRegDList(_rows_from_tuples(plain, (3,)) if plain
                                else np.zeros((0, 3), np.uint64), _mem_type(mem_type), metas)
        raise nixlInvalidParamError(f"cannot make descriptors of a {type(descs).__name__}")

    def get_xfer_descs(self, descs, mem_type: str | None = None, is_sorted: bool = False):
        """A transfer list from (addr, len, dev) tuples, an (N, 3) or -- NIXL
        1.5 -- (N, 5) (addr, len, dev, stride, count) integer array (taken at
        about the cost of a copy), a tensor or a list of tensors. Returns None
        (logging why) on bad input."""
        try:
            return self._xfer_descs(descs, mem_type)
        except (nixlInvalidParamError, nixlNotSupportedError) as e:
            log.error("get_xfer_descs: %s", e)
            return None

    def _xfer_descs(self, descs, mem_type) -> nixlXferDList:
        if isinstance(descs, nixlXferDList):
            if mem_type is not None and _mem_type(mem_type) != descs.mem_type:
                raise nixlInvalidParamError(f"a {descs.mem_type} list given as {mem_type}")
            return descs
        if isinstance(descs, nixlRegDList):
            return nixlXferDList(descs.rows, descs.mem_type)
        if isinstance(descs, np.ndarray):
            if descs.ndim == 2 and descs.shape[1] == 5 and mem_type is None:
                raise nixlInvalidParamError("strided (N, 5) rows need mem_type")
            return nixlXferDList(_rows_from_array(descs, (3, 5)), _mem_type(mem_type))
        if callable(getattr(descs, "data_ptr", None)):
            row, kind = _tensor_row(descs)
            return nixlXferDList(np.array([row], dtype=np.uint64), _mem_type(mem_type, kind))
        if isinstance(descs, (list, tuple)):
            if descs and all(callable(getattr(d, "data_ptr", None)) for d in descs):
                rows, kind = _tensor_rows(descs)
                return nixlXferDList(np.array(rows, dtype=np.uint64), _mem_type(mem_type, kind))
            rows = _rows_from_tuples(list(descs), (3,)) if descs else np.zeros((0, 3), np.uint64)
            return nixlXferDList(rows, _mem_type(mem_type))
        raise nixlInvalidParamError(f"cannot make descriptors of a {type(descs).__name__}")

    # ---- Memory -----------------------------------------------------------------------
    def register_memory(self, reg_list, mem_type: str | None = None, backends: list = [],
                        is_sorted: bool = False):
        """Registers every region of the list (all or nothing); returns the
        registration list to pass to deregister_memory. DRAM rows register as
        host memory, VRAM rows as GPU memory of device ``dev_id`` (refused,
        with nothing registered, where the CUDA driver says otherwise or
        there is none). (``is_sorted``, which older NIXL releases took and
        some callers still pass, is ignored.)"""
        self._check_backends(backends)
        dlist = self._reg_descs(reg_list, mem_type)
        addrs = [int(a) for a in dlist.rows[:, 0]]
        lengths = [int(n) for n in dlist.rows[:, 1]]
        if not addrs:
            raise nixlInvalidParamError("register_memory: an empty list")
        with self._mapped():
            self._engine.register_many(addrs, lengths, location=_locations(dlist))
        with self._lock:
            for addr, length in zip(addrs, lengths):
                self._registered[addr] = length
        return dlist

    def deregister_memory(self, dereg_list, backends: list = []) -> None:
        """Unregisters every region of the list (waiting for transfers that
        touch them); raises the first error after trying all."""
        self._check_backends(backends)
        dlist = self._reg_descs(dereg_list, None)
        addrs = [int(a) for a in dlist.rows[:, 0]]
        with self._mapped():
            try:
                self._engine.unregister_many(addrs)
            finally:
                with self._lock:
                    for addr in addrs:
                        self._registered.pop(addr, None)

    # ---- Metadata ---------------------------------------------------------------------
    def get_agent_metadata(self) -> bytes:
        """This agent's name, how to reach it and every region registered so
        far, as bytes to ship to peers (add_remote_agent)."""
        with self._mapped():
            body = self._engine.export_metadata()
        name = self.name.encode()
        peer = self._engine.peer_id.encode()
        return b"".join((_MAGIC, struct.pack("<I", len(name)), name,
                         struct.pack("<I", len(peer)), peer, body))

    @staticmethod
    def _parse_metadata(metadata) -> tuple[str, str, bytes]:
        try:
            data = bytes(metadata)
        except TypeError:
            raise nixlInvalidParamError(
                f"metadata must be bytes, not {type(metadata).__name__}") from None
        if not data.startswith(_MAGIC):
            raise nixlInvalidParamError("not the metadata of a Ferry NIXL agent "
                                        "(get_agent_metadata of this package)")
        try:
            at = len(_MAGIC)
            (n,) = struct.unpack_from("<I", data, at)
            name = data[at + 4:at + 4 + n].decode()
            at += 4 + n
            (m,) = struct.unpack_from("<I", data, at)
            peer = data[at + 4:at + 4 + m].decode()
            at += 4 + m
            if len(name) == 0 or len(peer) != m or at > len(data):
                raise ValueError("truncated")
        except (struct.error, UnicodeDecodeError, ValueError):
            raise nixlInvalidParamError("damaged agent metadata (truncated header)") from None
        return name, peer, data[at:]

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Loads a peer's metadata (no round trip); returns its agent name
        (bytes, as NIXL 1.4). Loading it again makes regions it registered
        since visible; a restarted peer's new metadata replaces the old."""
        name, peer_id, body = self._parse_metadata(metadata)
        if name == self.name:
            raise nixlInvalidParamError(f"add_remote_agent: {name!r} is this agent's own name")
        with self._mapped():
            segment = self._engine._import_metadata(body, peer_id)
        with self._lock:
            remote = self._remotes.get(name)
            if remote is None or remote.segment is not segment:
                self._remotes[name] = _Remote(name, peer_id, segment)
            else:
                remote.disconnected = False
        return name.encode()

    def remove_remote_agent(self, agent: str) -> None:
        """Forgets a remote agent; its handles raise nixlNotFoundError later."""
        name = _name(agent)
        with self._lock:
            remote = self._remotes.pop(name, None)
            if remote is None:
                return None
            remote.removed = True
            shared = any(r.segment is remote.segment for r in self._remotes.values())
        if not shared:
            try:
                self._engine.close_segment(remote.segment)
            except ferry.FerryError as e:
                log.debug("remove_remote_agent %s: %s", name, e)
        return None

    def check_remote_metadata(self, remote_name, descs=None) -> bool:
        """True if the agent's metadata is loaded and it has not disconnected
        since (and, with ``descs``, the rows lie inside its registered memory,
        as far as its loaded metadata says)."""
        try:
            remote = self._remote(remote_name)
        except nixlNotFoundError:
            return False
        if remote.disconnected:
            return False
        if descs is None:
            return True
        try:
            dlist = self._xfer_descs(descs, None)
            with self._mapped():
                self._engine.prepare(dlist.rows, remote.segment).release()
        except (nixlInvalidParamError, nixlNotFoundError, nixlNotSupportedError):
            return False
        return True

    def _remote(self, agent) -> _Remote:
        name = _name(agent)
        with self._lock:
            remote = self._remotes.get(name)
        if remote is None:
            raise nixlNotFoundError(f"no remote agent {name!r} is loaded (add_remote_agent)")
        return remote

    @contextmanager
    def _mapped(self, remote: _Remote | None = None) -> Iterator[None]:
        """Raises Ferry errors as NIXL's; marks `remote` disconnected on UNAVAILABLE."""
        try:
            yield
        except ferry.FerryError as e:
            exc = _translate(e)
            if remote is not None and isinstance(exc, nixlRemoteDisconnectError):
                remote.disconnected = True
            raise exc from e

    # ---- Prepared lists and transfers -------------------------------------------------
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type: str | None = None,
                        backends: list = [], is_sorted: bool = False) -> nixlPrepDlistHandle:
        """Prepares a list once: local (NIXL_INIT_AGENT = "", the string
        "NIXL_INIT_AGENT" or this agent's name), checked against registered
        memory, or of a loaded remote agent, checked against its metadata here
        (no round trip): a row outside its registered memory raises
        nixlNotFoundError naming it."""
        self._check_backends(backends)
        name = _name(agent_name)
        # vLLM passes the constant's name as a literal string
        local = name in (NIXL_INIT_AGENT, "NIXL_INIT_AGENT", self.name)
        if not isinstance(xfer_list, nixlXferDList):
            if (isinstance(xfer_list, np.ndarray) and xfer_list.ndim == 2
                    and xfer_list.shape[1] == 5 and mem_type is None):
                raise nixlInvalidParamError("prep_xfer_dlist: strided (N, 5) rows need mem_type")
        dlist = self._xfer_descs(xfer_list, mem_type)
        if len(dlist) == 0:
            raise nixlInvalidParamError("prep_xfer_dlist: an empty list")
        if local:
            with self._mapped():
                return nixlPrepDlistHandle(self._engine.prepare(dlist.rows), None, "")
        remote = self._remote(name)
        if remote.removed:
            raise nixlNotFoundError(f"remote agent {name!r} was removed")
        with self._mapped(remote):
            return nixlPrepDlistHandle(self._engine.prepare(dlist.rows, remote.segment), remote,
                                       name)

    def release_dlist_handle(self, handle: nixlPrepDlistHandle) -> None:
        if not isinstance(handle, nixlPrepDlistHandle):
            raise nixlInvalidParamError(f"not a prepared list handle: {handle!r}")
        with self._mapped():
            handle.dlist.release()

    @staticmethod
    def _op(operation) -> int:
        op = operation.upper() if isinstance(operation, str) else operation
        if op == "READ":
            return ferry.Opcode.READ
        if op == "WRITE":
            return ferry.Opcode.WRITE
        raise nixlInvalidParamError(f"unknown operation {operation!r}: 'READ' or 'WRITE'")

    def _notification(self, notif_msg):
        msg = _message(notif_msg)
        return (self.name, msg) if msg else None

    def make_prepped_xfer(self, operation: str, local_xfer_side: nixlPrepDlistHandle,
                          local_indices, remote_xfer_side: nixlPrepDlistHandle, remote_indices,
                          notif_msg: bytes = b"", backends: list = [],
                          skip_desc_merge: bool = False) -> nixlXferHandle:
        """A transfer of entry pairs of two prepared lists (lists or 1-D int
        arrays of indices, equally many, pairs equally long: else
        nixlInvalidParamError). ``notif_msg`` reaches the remote agent once
        the data is complete there (for a READ: once it is here). Adjacent
        pairs are merged (``skip_desc_merge`` is ignored)."""
        self._check_backends(backends)
        op = self._op(operation)
        if (not isinstance(local_xfer_side, nixlPrepDlistHandle)
                or local_xfer_side.remote is not None):
            raise nixlInvalidParamError("local_xfer_side must be a local prepared list "
                                        "(prep_xfer_dlist(NIXL_INIT_AGENT, ...))")
        if not isinstance(remote_xfer_side, nixlPrepDlistHandle) or remote_xfer_side.remote is None:
            raise nixlInvalidParamError("remote_xfer_side must be a remote agent's prepared list")
        remote = remote_xfer_side.remote
        self._check_remote(remote)
        with self._mapped(remote):
            transfer = self._engine.make_transfer(op, local_xfer_side.dlist, local_indices,
                                                  remote_xfer_side.dlist, remote_indices,
                                                  self._notification(notif_msg))
        return nixlXferHandle(transfer, remote, "READ" if op == ferry.Opcode.READ else "WRITE")

    def initialize_xfer(self, operation: str, local_descs, remote_descs, remote_agent,
                        notif_msg: bytes = b"", backends: list = []) -> nixlXferHandle:
        """prep_xfer_dlist of both sides + make_prepped_xfer of every entry in
        order (the lists must have equally many entries)."""
        self._check_backends(backends)
        op = self._op(operation)
        local = self.prep_xfer_dlist(NIXL_INIT_AGENT, local_descs)
        try:
            remote = self.prep_xfer_dlist(remote_agent, remote_descs)
            try:
                n_local, n_remote = len(local.dlist), len(remote.dlist)
                if n_local != n_remote:
                    raise nixlInvalidParamError(
                        f"initialize_xfer: {n_local} local entries but {n_remote} remote entries")
                indices = np.arange(n_local, dtype=np.uint32)
                return self.make_prepped_xfer("READ" if op == ferry.Opcode.READ else "WRITE",
                                              local, indices, remote, indices, notif_msg)
            finally:
                remote.dlist.release()  # the transfer keeps what it needs
        finally:
            local.dlist.release()

    def _check_remote(self, remote: _Remote) -> None:
        if remote.removed:
            raise nixlNotFoundError(f"remote agent {remote.name!r} was removed "
                                    "(remove_remote_agent)")

    def _xfer(self, handle) -> nixlXferHandle:
        if not isinstance(handle, nixlXferHandle):
            raise nixlInvalidParamError(f"not a transfer handle: {handle!r}")
        if handle.transfer.released:
            raise nixlInvalidParamError("the transfer handle was released")
        return handle

    def transfer(self, handle: nixlXferHandle, notif_msg: bytes = b"") -> str:
        """Posts the transfer: "DONE" if it already finished, else "PROC".
        Failures raise; reposting one still in flight raises
        nixlRepostActiveError."""
        h = self._xfer(handle)
        self._check_remote(h.remote)
        with self._mapped(h.remote):
            h.transfer.post(self._notification(notif_msg) if notif_msg else None)
            h.posted = True
        return self._state(h)

    def check_xfer_state(self, handle: nixlXferHandle) -> str:
        """"DONE" or "PROC"; a failure raises (nixlRemoteDisconnectError when
        the peer is gone; nixlNotFoundError when it was removed)."""
        h = self._xfer(handle)
        self._check_remote(h.remote)
        return self._state(h)

    def _state(self, h: nixlXferHandle) -> str:
        with self._mapped(h.remote):
            state, error = h.transfer.status()
            if state == ferry.TransferState.PENDING:
                return "PROC"
            if state == ferry.TransferState.COMPLETED:
                return "DONE"
            raise error

    def get_xfer_telemetry(self, handle: nixlXferHandle) -> nixlXferTelemetry:
        """Telemetry of the last post (needs capture_telemetry=True)."""
        if not self._capture_telemetry:
            raise nixlNoTelemetryError("telemetry is off: make the agent with "
                                       "nixl_agent_config(capture_telemetry=True)")
        h = self._xfer(handle)
        if not h.posted:
            raise nixlNoTelemetryError("the transfer was never posted")
        with self._mapped():
            t = h.transfer.telemetry()
        return nixlXferTelemetry(t.start_us, t.post_us, t.transfer_us, t.bytes, t.entries)

    def release_xfer_handle(self, handle: nixlXferHandle) -> None:
        """Releases the transfer, cancelling it if in flight: once this
        returns none of its bytes land in local memory any more."""
        if not isinstance(handle, nixlXferHandle):
            raise nixlInvalidParamError(f"not a transfer handle: {handle!r}")
        with self._mapped():
            handle.transfer.release()

    # ---- Notifications ----------------------------------------------------------------
    def send_notif(self, remote_agent_name, notif_msg, backend: str | None = None) -> None:
        """Sends a message (up to 1 MiB) to a remote agent; returns once it
        acknowledged. Messages from one agent to another arrive in order."""
        if backend is not None:
            self._check_backends([backend])
        remote = self._remote(remote_agent_name)
        self._check_remote(remote)
        with self._mapped(remote):
            self._engine.notify(remote.segment, self.name, _message(notif_msg))

    def get_new_notifs(self, backends: list = []) -> dict:
        """Drains the notifications received so far: {sender agent name:
        [message bytes, oldest first]}."""
        self._check_backends(backends)
        out: dict[str, list] = {}
        with self._mapped():
            for note in self._engine.notifications():
                out.setdefault(note.name, []).append(note.message)
        return out

    def update_notifs(self, backends: list = []) -> dict:
        """Adds new notifications to ``self.notifs`` and returns it."""
        new = self.get_new_notifs(backends)
        with self._lock:
            for name, messages in new.items():
                self.notifs.setdefault(name, []).extend(messages)
            return self.notifs

    # ---- Lifetime -----------------------------------------------------------------
    def close(self) -> None:
        """Shuts the agent's engine down (in-flight transfers are cancelled).
        Not in upstream NIXL, which tears down when the agent is collected;
        that happens here too."""
        self._engine.close()

    def __repr__(self):
        return f"<nixl_agent {self.name} {self._engine.peer_id}>"


class _Backend:
    """What ``agent.backends[name]`` holds: an opaque backend record."""

    __slots__ = ("name", "params")

    def __init__(self, name: str, params: dict):
        self.name = name
        self.params = params

    def __bool__(self) -> bool:
        return True

    def __repr__(self):
        return f"<nixl backend {self.name} (Ferry transport auto)>"


__all__ = ["nixlBind", "nixl_agent", "nixl_agent_config", "nixlPrepDlistHandle", "nixlRegDList",
           "nixlXferDList", "nixlXferHandle"]
