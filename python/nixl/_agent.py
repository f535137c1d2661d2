"""``nixl._bindings.nixlAgent``: NIXL's native agent API on a Ferry engine.

One ``ferry.Engine`` per agent (its local name is the agent's name; it
listens on a free 127.0.0.1 port unless FERRY_* settings or the config's
``ferryOptions`` say otherwise). Backends ``UCX``, ``LIBFABRIC``, ``FERRY``
and ``MOCK_DRAM`` (NIXL's test backend) all run on Ferry's transport ``auto``
(per peer the first of local, cuda_ipc, shm, fabric, tcp that reaches it);
``POSIX`` moves FILE memory (``nixl._files``: rows ``(offset, len, fd)``)
between the agent's host memory and its own files, and answers ``queryMem``;
``GDS`` and ``GDS_MT`` are refused, naming why. Handles are ints.

Metadata bytes (``getLocalMD``) are Ferry's, in an envelope: they load into
this drop-in only. With ``useListenThread`` the agent serves them on
``listenPort`` (NIXL's side channel: ``nixl._channel``); ``sendLocalMD`` /
``fetchRemoteMD`` / ``invalidateLocalMD`` with an empty address use etcd when
NIXL_ETCD_ENDPOINTS is set.
"""

from __future__ import annotations

import logging
import math
import os
import stat
import struct
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

import ferry

from ._bindings import (DEFAULT_COMM_PORT, NIXL_IN_PROG, NIXL_SUCCESS, NIXL_ERR_NOT_FOUND, nixl_mem_t,
                        nixl_xfer_op_t, nixlAgentConfig, nixlBackendError, nixlCancelledError,
                        nixlInvalidParamError, nixlMismatchError, nixlNoTelemetryError,
                        nixlNotFoundError, nixlNotPostedError, nixlNotSupportedError,
                        nixlRemoteDisconnectError, nixlRepostActiveError, nixlXferTelemetry)
from ._dlist import nixlRegDList, nixlXferDList
from ._files import GDS_PLUGINS, FileRegistrations, gds_refusal, refuse_remote_files

log = logging.getLogger("nixl")

# Plugins: name -> (memory types, parameters). Every transfer backend is
# Ferry's transport "auto"; POSIX moves FILE memory (and answers queryMem).
_MOVERS = ("UCX", "LIBFABRIC", "FERRY", "MOCK_DRAM")
PLUGINS = {name: (["DRAM", "VRAM"], {}) for name in _MOVERS}
PLUGINS["POSIX"] = (["FILE"], {})

# Metadata envelope (docs/wire-format.md, "NIXL agent metadata"): magic, then
# u32-length-prefixed agent name and peer id, u32 count of visible regions
# (0xFFFFFFFF: all of them) and that many (u64 addr, u64 len, u32 mem type),
# then Ferry's exported metadata.
_MAGIC = b"FERRY-NIXL\x02"
_ALL = 0xFFFFFFFF
_REGION = struct.Struct("<QQI")
_ADDRESS_END = (1 << 64) - 1  # a region's end must fit a uint64


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


def _text(value: Any, what: str) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return value
    raise nixlInvalidParamError(f"{what} is str or bytes, not {type(value).__name__}")


def _message(msg: Any) -> bytes:
    if isinstance(msg, str):
        return msg.encode()
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    raise nixlInvalidParamError(f"a notification message is bytes or str, not {type(msg).__name__}")


def _port(port: int) -> int:
    """A metadata listener's port: 0 (the native calls' default) is NIXL's."""
    return int(port) or DEFAULT_COMM_PORT


def _locations(dlist: nixlRegDList | nixlXferDList) -> list:
    """Ferry's location of each row: "cpu" for DRAM, "cuda:{dev}" for VRAM."""
    if dlist.getType() == nixl_mem_t.VRAM_SEG:
        return [f"cuda:{int(dev)}" for dev in dlist.rows[:, 2]]
    return ["cpu"] * dlist.rows.shape[0]


def _check_list(dlist, cls: type, what: str) -> None:
    """`dlist` is a non-empty `cls` of memory Ferry moves, or `what` says why not."""
    if not isinstance(dlist, cls):
        raise nixlInvalidParamError(f"{what}: takes a {cls.__name__}, not {type(dlist).__name__}")
    mem = dlist.getType()
    if mem not in (nixl_mem_t.DRAM_SEG, nixl_mem_t.VRAM_SEG, nixl_mem_t.FILE_SEG):
        raise nixlNotSupportedError(
            f"{what}: {mem.name[:-4]} memory is not supported by Ferry's NIXL agent (DRAM, "
            "VRAM and FILE move)")
    if dlist.isEmpty():
        raise nixlInvalidParamError(f"{what}: an empty list")


class _Remote:
    """A loaded remote agent: its Ferry segment, what its metadata made
    visible (None: every region) and whether it is still usable."""

    __slots__ = ("name", "peer_id", "segment", "visible", "removed", "disconnected")

    def __init__(self, name: str, peer_id: str, segment: ferry.Segment):
        self.name = name
        self.peer_id = peer_id
        self.segment = segment
        self.visible: np.ndarray | None = None  # (K, 2) [start, end) rows, sorted
        self.removed = False
        self.disconnected = False

    def outside(self, rows: np.ndarray) -> int:
        """Index of the first row outside the visible regions, or -1."""
        if self.visible is None or rows.shape[0] == 0:
            return -1
        plain = rows if rows.shape[1] == 3 else rows[:, :3]
        starts = plain[:, 0].astype(np.uint64)
        ends = starts + plain[:, 1].astype(np.uint64)
        if rows.shape[1] == 5:  # strided: the last entry of each row ends furthest
            ends = ends + rows[:, 3].astype(np.uint64) * (rows[:, 4].astype(np.uint64) - 1)
        if self.visible.shape[0] == 0:
            return 0
        at = np.searchsorted(self.visible[:, 0], starts, side="right") - 1
        ok = (at >= 0) & (ends <= self.visible[np.maximum(at, 0), 1])
        bad = np.flatnonzero(~ok)
        return int(bad[0]) if bad.size else -1


class _Prepped:
    __slots__ = ("dlist", "remote", "count")

    def __init__(self, dlist: ferry.DescList, remote: _Remote | None, count: int):
        self.dlist = dlist
        self.remote = remote  # None: the local side
        self.count = count


class _Xfer:
    __slots__ = ("transfer", "remote", "op", "count", "backend", "posted", "post_us",
                 "reported")

    def __init__(self, transfer: ferry.Transfer, remote: _Remote, op: nixl_xfer_op_t,
                 count: int, backend: int):
        self.transfer = transfer
        self.remote = remote
        self.op = op
        self.count = count  # the caller's descriptors
        self.backend = backend
        self.posted = False
        self.post_us = 0
        self.reported = False  # completion given to telemetry


class nixlAgent:
    """NIXL's native agent (``nixl._bindings.nixlAgent(name, config)``) on a
    Ferry engine; see the module docstring. Thread-safe."""

    def __init__(self, name: str, config: nixlAgentConfig | None = None):
        if not isinstance(name, str):
            raise TypeError(f"an agent name is a str, not {type(name).__name__}")
        if not name:
            raise ValueError("nixlAgent: the agent name is empty")
        config = config if config is not None else nixlAgentConfig()
        self.name = name
        self.config = config
        self._lock = threading.Lock()
        self._next = 0x1000
        self._backends: dict[int, str] = {}
        self._prepped: dict[int, _Prepped] = {}
        self._xfers: dict[int, _Xfer] = {}
        self._remotes: dict[str, _Remote] = {}
        self._self_remote: _Remote | None = None
        self._registered: dict[int, tuple] = {}  # addr -> (len, mem type)
        self._partial: dict[str, bytes] = {}  # label -> partial metadata sent under it
        options: dict[str, Any] = {"local_name": name}
        options.update(getattr(config, "ferryOptions", None) or {})
        try:
            self._engine = ferry.Engine(**options)
        except ferry.FerryError as e:
            raise _translate(e) from e
        from ._telemetry import AgentTelemetry

        self._telemetry = AgentTelemetry.configure(name, config.captureTelemetry)
        self._files = FileRegistrations(self._engine)
        self._channel = None
        if config.useListenThread:
            self._channel = self._make_channel(listen=True)

    # ---- helpers ----------------------------------------------------------------
    def _handle(self, table: dict, obj: Any) -> int:
        with self._lock:
            self._next += 0x10
            table[self._next] = obj
            return self._next

    def _lookup(self, table: dict, handle: Any, what: str):
        obj = table.get(handle) if isinstance(handle, int) else None
        if obj is None:
            raise nixlInvalidParamError(f"{handle!r} is not a live {what} handle of agent "
                                        f"{self.name!r}")
        return obj

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

    def _check_backends(self, backends) -> None:
        for b in backends or ():
            self._lookup(self._backends, b, "backend")

    def _make_channel(self, listen: bool):
        from ._channel import MetadataChannel

        host = self._engine.peer_id.rpartition(":")[0].strip("[]") or "127.0.0.1"
        return MetadataChannel(self.name, listen=listen, port=self.config.listenPort,
                               local_md=self._md_for_label, load_md=self._load_from_channel,
                               drop_agent=self.invalidateRemoteMD, bind_host=host)

    def _channel_or_make(self):
        with self._lock:
            if self._channel is None:
                self._channel = self._make_channel(listen=False)
            return self._channel

    # ---- plugins and backends ---------------------------------------------------
    def getAvailPlugins(self) -> list:
        return list(PLUGINS)

    def getPluginParams(self, type: str) -> tuple:  # noqa: A002 (NIXL's name)
        if type in GDS_PLUGINS:
            raise nixlNotSupportedError(gds_refusal(type))
        if type not in PLUGINS:
            raise nixlNotFoundError(f"plugin {type!r} does not exist here; available: "
                                    f"{', '.join(PLUGINS)}")
        mems, params = PLUGINS[type]
        return dict(params), list(mems)

    def getBackendParams(self, backend: int) -> tuple:
        return self.getPluginParams(self._lookup(self._backends, backend, "backend"))

    def createBackend(self, type: str, initParams: dict | None = None) -> int:  # noqa: A002
        self.getPluginParams(type)
        for handle, name in self._backends.items():
            if name == type:
                return handle  # one instance per plugin, as NIXL
        return self._handle(self._backends, type)

    # ---- memory -----------------------------------------------------------------
    def registerMem(self, descs: nixlRegDList, backends: list = []) -> int:
        self._check_backends(backends)
        _check_list(descs, nixlRegDList, "registerMem")
        if descs.getType() == nixl_mem_t.FILE_SEG:
            with self._mapped():
                total = self._files.register(descs.rows, descs.metas())
            self._telemetry.memory_registered(total)
            return NIXL_SUCCESS
        addrs = [int(a) for a in descs.rows[:, 0]]
        lengths = [int(n) for n in descs.rows[:, 1]]
        with self._mapped():
            self._engine.register_many(addrs, lengths, location=_locations(descs))
        with self._lock:
            for addr, length in zip(addrs, lengths):
                self._registered[addr] = (length, descs.getType())
        self._telemetry.memory_registered(sum(lengths))
        return NIXL_SUCCESS

    def deregisterMem(self, descs: nixlRegDList, backends: list = []) -> int:
        self._check_backends(backends)
        if not isinstance(descs, nixlRegDList):
            raise nixlInvalidParamError(f"deregisterMem takes a nixlRegDList, not "
                                        f"{type(descs).__name__}")
        if descs.getType() == nixl_mem_t.FILE_SEG:
            with self._mapped():
                freed = self._files.unregister(descs.rows)
            self._telemetry.memory_deregistered(freed)
            return NIXL_SUCCESS
        addrs = [int(a) for a in descs.rows[:, 0]]
        freed = 0
        with self._mapped():
            try:
                self._engine.unregister_many(addrs)
            finally:
                with self._lock:
                    for addr in addrs:
                        length, _ = self._registered.pop(addr, (0, None))
                        freed += length
                self._telemetry.memory_deregistered(freed)
        return NIXL_SUCCESS

    def queryMem(self, descs: nixlRegDList, backend: int) -> list:
        """For FILE lists: per row, None if the file in its meta info cannot
        be reached, else {"size", "mode", "mtime"} (strings). Memory lists:
        nixlNotSupportedError."""
        self._lookup(self._backends, backend, "backend")
        if descs.getType() != nixl_mem_t.FILE_SEG:
            raise nixlNotSupportedError(f"queryMem: {descs.getType().name[:-4]} memory cannot "
                                        "be queried (FILE lists can)")
        out = []
        for meta in descs.metas():
            try:
                st = os.stat(meta.decode("utf-8", "surrogateescape"))
            except OSError:
                out.append(None)
                continue
            out.append({"size": str(st.st_size), "mode": str(stat.S_IMODE(st.st_mode)),
                        "mtime": str(int(st.st_mtime))})
        return out

    # ---- metadata ---------------------------------------------------------------
    def _envelope(self, regions: np.ndarray | None) -> bytes:
        with self._mapped():
            body = self._engine.export_metadata()
        name = self.name.encode()
        peer = self._engine.peer_id.encode()
        parts = [_MAGIC, struct.pack("<I", len(name)), name, struct.pack("<I", len(peer)), peer]
        if regions is None:
            parts.append(struct.pack("<I", _ALL))
        else:
            parts.append(struct.pack("<I", regions.shape[0]))
            parts.extend(_REGION.pack(int(a), int(n), int(m)) for a, n, m in regions)
        parts.append(body)
        return b"".join(parts)

    def getLocalMD(self) -> bytes:
        return self._envelope(None)

    def getLocalPartialMD(self, descs: nixlRegDList, inc_conn_info: bool = False,
                          backends: list = []) -> bytes:
        """Metadata that makes only the regions of `descs` (each must be
        registered here) visible to the agent loading it. Ferry's part always
        carries how to reach this agent, so ``inc_conn_info`` changes nothing."""
        self._check_backends(backends)
        rows = []
        with self._lock:
            registered = dict(self._registered)
        for i in range(descs.descCount()):
            addr, length = int(descs.rows[i, 0]), int(descs.rows[i, 1])
            entry = registered.get(addr)
            if entry is None or entry[0] < length:
                raise nixlNotFoundError(f"getLocalPartialMD: row {i} ({addr:#x}, {length}) is "
                                        f"not a region registered on agent {self.name!r}")
            rows.append((addr, entry[0], int(entry[1])))
        return self._envelope(np.array(rows, dtype=np.uint64).reshape(-1, 3))

    @staticmethod
    def _parse(metadata) -> tuple:
        try:
            data = bytes(metadata)
        except TypeError:
            raise nixlInvalidParamError(
                f"metadata must be bytes, not {type(metadata).__name__}") from None
        if not data.startswith(_MAGIC):
            raise nixlInvalidParamError("not the metadata of a Ferry NIXL agent "
                                        "(getLocalMD / get_agent_metadata of this package)")
        try:
            at = len(_MAGIC)
            fields = []
            for _ in range(2):
                (n,) = struct.unpack_from("<I", data, at)
                fields.append(data[at + 4:at + 4 + n].decode())
                if len(fields[-1].encode()) != n:
                    raise ValueError("truncated")
                at += 4 + n
            (count,) = struct.unpack_from("<I", data, at)
            at += 4
            regions = None
            if count != _ALL:
                if at + count * _REGION.size > len(data):
                    raise ValueError("truncated")
                rows = [_REGION.unpack_from(data, at + k * _REGION.size) for k in range(count)]
                if any(a + n > _ADDRESS_END for a, n, _m in rows):
                    raise ValueError("a region past the end of the address space")
                at += count * _REGION.size
                regions = np.array([(a, a + n) for a, n, _m in rows],
                                   dtype=np.uint64).reshape(-1, 2)
            if not fields[0]:
                raise ValueError("no name")
        except (struct.error, UnicodeDecodeError, ValueError):
            raise nixlInvalidParamError("damaged agent metadata (truncated header)") from None
        return fields[0], fields[1], regions, data[at:]

    def loadRemoteMD(self, metadata: bytes) -> bytes:
        """Loads a peer's metadata (no round trip); returns its name as bytes.
        Loading again makes its later registrations visible; partial metadata
        adds the regions it lists; a restarted peer's metadata replaces the
        old. The agent's own metadata is accepted (loopback)."""
        name, peer_id, regions, body = self._parse(metadata)
        with self._mapped():
            segment = self._engine._import_metadata(body, peer_id)
        with self._lock:
            remote = self._remotes.get(name)
            if remote is None or remote.segment is not segment:
                remote = self._remotes[name] = _Remote(name, peer_id, segment)
                remote.visible = None if regions is None else regions[np.argsort(regions[:, 0])]
            else:
                remote.disconnected = False
                remote.removed = False
                if regions is None:
                    remote.visible = None
                elif remote.visible is not None:
                    rows = np.concatenate([remote.visible, regions])
                    remote.visible = rows[np.argsort(rows[:, 0], kind="stable")]
        return name.encode()

    def invalidateRemoteMD(self, remote_agent: str) -> int:
        """Forgets a remote agent (NIXL_ERR_NOT_FOUND if it was not loaded;
        returned, not raised, as NIXL does); its handles fail later."""
        name = _text(remote_agent, "an agent name")
        with self._lock:
            remote = self._remotes.pop(name, None)
            if remote is None:
                return NIXL_ERR_NOT_FOUND
            remote.removed = True
            shared = any(r.segment is remote.segment for r in self._remotes.values())
            if self._self_remote is not None and self._self_remote.segment is remote.segment:
                shared = True
        if not shared:
            try:
                self._engine.close_segment(remote.segment)
            except ferry.FerryError as e:
                log.debug("invalidateRemoteMD %s: %s", name, e)
        return NIXL_SUCCESS

    def checkRemoteMD(self, remote_name: str, descs: nixlXferDList | None = None) -> int:
        """NIXL_SUCCESS if the agent's metadata is loaded, it has not
        disconnected since, and `descs` (if any rows) lie in what it made
        visible; NIXL_ERR_NOT_FOUND otherwise (returned, not raised)."""
        try:
            remote = self._remote(remote_name)
        except nixlNotFoundError:
            return NIXL_ERR_NOT_FOUND
        if remote.disconnected or remote.removed:
            return NIXL_ERR_NOT_FOUND
        if descs is None or descs.isEmpty():
            return NIXL_SUCCESS
        try:
            self._prepare(descs, remote).release()
        except (nixlInvalidParamError, nixlNotFoundError, nixlNotSupportedError):
            return NIXL_ERR_NOT_FOUND
        return NIXL_SUCCESS

    def _md_for_label(self, label: str) -> bytes:
        with self._lock:
            partial = self._partial.get(label) if label else None
        return partial if partial is not None else self.getLocalMD()

    def _load_from_channel(self, metadata: bytes) -> str:
        return self.loadRemoteMD(metadata).decode()

    def sendLocalMD(self, ip_addr: str = "", port: int = 0) -> None:
        self._channel_or_make().send_md(self.getLocalMD(), ip_addr, _port(port))

    def sendLocalPartialMD(self, descs: nixlRegDList, inc_conn_info: bool = False,
                           backends: list = [], ip_addr: str = "", port: int = 0,
                           label: str = "") -> None:
        md = self.getLocalPartialMD(descs, inc_conn_info, backends)
        if label:
            with self._lock:
                self._partial[label] = md
        self._channel_or_make().send_md(md, ip_addr, _port(port), label, partial=True)

    def fetchRemoteMD(self, remote_agent: str, ip_addr: str = "", port: int = 0,
                      label: str = "") -> None:
        self._channel_or_make().fetch_md(_text(remote_agent, "an agent name"), ip_addr,
                                         _port(port), label)

    def invalidateLocalMD(self, ip_addr: str = "", port: int = 0) -> None:
        self._channel_or_make().invalidate(ip_addr, _port(port))

    # ---- remote agents ----------------------------------------------------------
    def _remote(self, agent) -> _Remote:
        name = _text(agent, "an agent name")
        with self._lock:
            remote = self._remotes.get(name)
        if remote is None and name == self.name:
            return self._loopback()
        if remote is None:
            raise nixlNotFoundError(f"no remote agent {name!r} is loaded on agent "
                                    f"{self.name!r} (loadRemoteMD / add_remote_agent)")
        return remote

    def _loopback(self) -> _Remote:
        """This agent as its own peer (loopback transfers and notifications)."""
        with self._lock:
            remote = self._self_remote
        if remote is None:
            with self._mapped():
                segment = self._engine.open_segment(self._engine.peer_id)
            with self._lock:
                if self._self_remote is None:
                    self._self_remote = _Remote(self.name, self._engine.peer_id, segment)
                remote = self._self_remote
        return remote

    def makeConnection(self, remote_agent: str, backends: list = []) -> int:
        """Connects to the agent now (a round trip), so the first transfer
        does not pay for it."""
        self._check_backends(backends)
        remote = self._remote(remote_agent)
        with self._mapped(remote):
            self._engine.query_segment(remote.segment)
        return NIXL_SUCCESS

    # ---- prepared lists and transfers --------------------------------------------
    def _prepare(self, descs: nixlXferDList, remote: _Remote | None) -> ferry.DescList:
        _check_list(descs, nixlXferDList, "a transfer list")
        rows = descs.rows
        if descs.getType() == nixl_mem_t.FILE_SEG:
            if remote is not None and remote.name != self.name:
                refuse_remote_files(remote.name)
            rows = self._files.addresses(rows)  # this agent's own files
        if remote is None:
            with self._mapped():
                return self._engine.prepare(rows)
        if remote.removed:
            raise nixlNotFoundError(f"remote agent {remote.name!r} was removed")
        bad = remote.outside(rows)
        if bad >= 0:
            raise nixlNotFoundError(f"row {bad} lies outside the regions agent {remote.name!r} "
                                    "made visible (its partial metadata)")
        with self._mapped(remote):
            return self._engine.prepare(rows, remote.segment)

    def prepXferDlist(self, *args, **kwargs) -> int:
        """prepXferDlist(agent_name, descs, backend=[]) or prepXferDlist(descs,
        backend=[]) (the local side). agent_name NIXL_INIT_AGENT ("") is the
        local side too; this agent's own name is loopback."""
        if "agent_name" in kwargs or (args and isinstance(args[0], (str, bytes))):
            return self._prep(*args, **kwargs)
        return self._prep(None, *args, **kwargs)

    def _prep(self, agent_name, descs, backend: list = []) -> int:
        self._check_backends(backend)
        remote = None
        if agent_name is not None and _text(agent_name, "an agent name") != "":
            remote = self._remote(agent_name)
        dlist = self._prepare(descs, remote)
        return self._handle(self._prepped, _Prepped(dlist, remote, descs.descCount()))

    def releasedDlistH(self, handle: int) -> int:
        prepped = self._lookup(self._prepped, handle, "prepared list")
        with self._lock:
            self._prepped.pop(handle, None)
        prepped.dlist.release()
        return NIXL_SUCCESS

    @staticmethod
    def _op(operation) -> nixl_xfer_op_t:
        try:
            return nixl_xfer_op_t(int(operation))
        except (TypeError, ValueError):
            raise nixlInvalidParamError(f"unknown operation {operation!r}: NIXL_READ or "
                                        "NIXL_WRITE") from None

    def _notification(self, notif_msg):
        msg = _message(notif_msg)
        return (self.name, msg) if msg else None

    def _backend_of(self, backends) -> int:
        self._check_backends(backends)
        if backends:
            return backends[0]
        with self._lock:
            return next(iter(self._backends), 0)

    def makeXferReq(self, operation, local_side: int, local_indices, remote_side: int,
                    remote_indices, notif_msg: str = "", backend: list = [],
                    skip_desc_merg: bool = False) -> int:
        op = self._op(operation)
        local = self._lookup(self._prepped, local_side, "prepared list")
        remote = self._lookup(self._prepped, remote_side, "prepared list")
        if local.remote is not None:
            raise nixlInvalidParamError("local_side must be a local prepared list "
                                        "(prepXferDlist(NIXL_INIT_AGENT, ...))")
        if remote.remote is None:
            raise nixlInvalidParamError("remote_side must be a remote (or loopback) agent's "
                                        "prepared list")
        peer = remote.remote
        if peer.removed:
            raise nixlNotFoundError(f"remote agent {peer.name!r} was removed")
        backend_handle = self._backend_of(backend)
        with self._mapped(peer):
            transfer = self._engine.make_transfer(ferry.Opcode.READ if op == 0 else
                                                  ferry.Opcode.WRITE, local.dlist, local_indices,
                                                  remote.dlist, remote_indices,
                                                  self._notification(notif_msg))
        count = len(local_indices) if hasattr(local_indices, "__len__") else 0
        return self._handle(self._xfers, _Xfer(transfer, peer, op, count, backend_handle))

    def createXferReq(self, operation, local_descs: nixlXferDList, remote_descs: nixlXferDList,
                      remote_agent: str, notif_msg: str = "", backend: list = []) -> int:
        op = self._op(operation)
        self._check_backends(backend)
        for side, d in (("local", local_descs), ("remote", remote_descs)):
            if not isinstance(d, nixlXferDList):
                raise nixlInvalidParamError(f"createXferReq: the {side} list is a "
                                            f"{type(d).__name__}, not a nixlXferDList")
        n_local, n_remote = local_descs.descCount(), remote_descs.descCount()
        if n_local != n_remote:
            raise nixlInvalidParamError(f"createXferReq: {n_local} local descriptors but "
                                        f"{n_remote} remote descriptors")
        local = self._prepare(local_descs, None)
        try:
            peer = self._remote(remote_agent)
            remote = self._prepare(remote_descs, peer)
            try:
                indices = np.arange(n_local, dtype=np.uint32)
                with self._mapped(peer):
                    transfer = self._engine.make_transfer(
                        ferry.Opcode.READ if op == 0 else ferry.Opcode.WRITE, local, indices,
                        remote, indices, self._notification(notif_msg))
            finally:
                remote.release()  # the transfer keeps what it needs
        finally:
            local.release()
        return self._handle(self._xfers, _Xfer(transfer, peer, op, n_local,
                                               self._backend_of(backend)))

    def _xfer(self, reqh) -> _Xfer:
        xfer = self._lookup(self._xfers, reqh, "transfer")
        if xfer.remote.removed:
            raise nixlNotFoundError(f"remote agent {xfer.remote.name!r} was removed "
                                    "(invalidateRemoteMD / remove_remote_agent)")
        return xfer

    def postXferReq(self, reqh: int, notif_msg: str = "") -> int:
        """Posts the transfer: NIXL_SUCCESS if it already finished, else
        NIXL_IN_PROG; failures raise (reposting one in flight:
        nixlRepostActiveError)."""
        xfer = self._xfer(reqh)
        started = time.perf_counter_ns()
        with self._mapped(xfer.remote):
            xfer.transfer.post(self._notification(notif_msg) if notif_msg else None)
        xfer.post_us = max(1, math.ceil((time.perf_counter_ns() - started) / 1000))
        xfer.posted = True
        xfer.reported = False
        return self._state(xfer)

    def getXferStatus(self, reqh: int) -> int:
        return self._state(self._xfer(reqh))

    def _state(self, xfer: _Xfer) -> int:
        with self._mapped(xfer.remote):
            state, error = xfer.transfer.status()
        if state == ferry.TransferState.PENDING:
            return NIXL_IN_PROG
        if not xfer.reported:
            xfer.reported = True
            self._report(xfer, error)
        if state == ferry.TransferState.COMPLETED:
            return NIXL_SUCCESS
        exc = _translate(error)
        if isinstance(exc, nixlRemoteDisconnectError):
            xfer.remote.disconnected = True
        raise exc from error

    def _report(self, xfer: _Xfer, error) -> None:
        if error is not None:
            self._telemetry.error(_translate(error).status)
            return
        t = self._telemetry_of(xfer)
        self._telemetry.transfer_done(start_us=t.startTime, post_us=t.postDuration,
                                      xfer_us=t.xferDuration, total_bytes=t.totalBytes,
                                      desc_count=t.descCount,
                                      op="READ" if xfer.op == 0 else "WRITE",
                                      remote=xfer.remote.name)

    def _telemetry_of(self, xfer: _Xfer) -> nixlXferTelemetry:
        with self._mapped():
            t = xfer.transfer.telemetry()
        done = t.transfer_us or (xfer.post_us if xfer.transfer.done() else 0)
        return nixlXferTelemetry(t.start_us, xfer.post_us,
                                 max(done, xfer.post_us) if done else 0, t.bytes,
                                 xfer.count or t.entries)

    def getXferTelemetry(self, reqh: int) -> nixlXferTelemetry:
        xfer = self._xfer(reqh)
        if not self._telemetry.enabled:
            raise nixlNoTelemetryError(
                f"telemetry is off on agent {self.name!r}: set NIXL_TELEMETRY_ENABLE=y or make "
                "the agent with capture_telemetry=True (and without NIXL_TELEMETRY_ENABLE=n)")
        if not xfer.posted:
            raise nixlNoTelemetryError("the transfer was never posted")
        return self._telemetry_of(xfer)

    def queryXferBackend(self, reqh: int) -> int:
        xfer = self._xfer(reqh)
        if not xfer.backend:
            raise nixlNotFoundError(f"agent {self.name!r} has no backend (createBackend)")
        return xfer.backend

    def estimateXferCost(self, req_handle: int) -> tuple:
        self._xfer(req_handle)
        raise nixlNotSupportedError("estimateXferCost: Ferry's backends have no cost model "
                                    "(as NIXL's UCX backend)")

    def releaseXferReq(self, reqh: int) -> int:
        """Releases the transfer, cancelling it if in flight: once this
        returns none of its bytes land in local memory any more."""
        xfer = self._lookup(self._xfers, reqh, "transfer")
        with self._lock:
            self._xfers.pop(reqh, None)
        with self._mapped():
            xfer.transfer.release()
        return NIXL_SUCCESS

    # ---- notifications -------------------------------------------------------------
    def genNotif(self, remote_agent: str, msg, backends: list = []) -> int:
        """Sends a message (up to 1 MiB) to an agent (this one too); returns
        once it was acknowledged. Messages from one agent to another arrive
        in order."""
        if isinstance(backends, int):
            backends = [backends]
        self._check_backends(backends)
        remote = self._remote(remote_agent)
        if remote.removed:
            raise nixlNotFoundError(f"remote agent {remote.name!r} was removed")
        with self._mapped(remote):
            self._engine.notify(remote.segment, self.name, _message(msg))
        return NIXL_SUCCESS

    def getNotifs(self, notif_map: dict, backends: list = []) -> dict:
        """A copy of `notif_map` with the notifications received since the
        last call added: {sender agent name: [message bytes, oldest first]}."""
        self._check_backends(backends)
        out = {name: list(messages) for name, messages in (notif_map or {}).items()}
        with self._mapped():
            for note in self._engine.notifications():
                out.setdefault(note.name, []).append(note.message)
        return out

    # ---- memory views (UCX's GPU device API) ----------------------------------------
    def prepMemView(self, dlist, backends: list = []) -> int:
        raise nixlNotSupportedError("prepMemView needs UCX's GPU device API, which Ferry does "
                                    "not have (HAVE_UCX_GPU_DEVICE_API is False)")

    def releaseMemView(self, mvh: int) -> None:
        raise nixlNotSupportedError("releaseMemView: there are no memory views (prepMemView)")

    # ---- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the metadata listener and shuts the engine down (transfers
        in flight are cancelled). Not in NIXL, where this happens when the
        agent is collected; it happens then here too."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        self._telemetry.close()
        self._engine.close()

    def __del__(self):
        try:
            if getattr(self, "_channel", None) is not None:
                self._channel.close()
            if getattr(self, "_telemetry", None) is not None:
                self._telemetry.close()
        except Exception:  # interpreter shutdown
            pass

    @property
    def engine(self) -> ferry.Engine:
        """The agent's Ferry engine (Ferry extension)."""
        return self._engine

    def __repr__(self):
        return f"<nixlAgent {self.name} {self._engine.peer_id}>"
