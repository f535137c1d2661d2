"""nixl._api: NVIDIA NIXL's agent API (``nixl_agent``, ``nixl_agent_config``, the
handle classes, ``nixl_thread_sync_t``) on Ferry, built on ``nixl._bindings``
the way upstream's is on its native module.

One ``ferry.Engine`` per agent (``nixl._agent``): backends ``UCX``,
``LIBFABRIC``, ``FERRY`` and ``MOCK_DRAM`` all map onto Ferry's transport
``auto``: per peer, the first of ``local`` (within a process), ``cuda_ipc``
(a peer's GPU memory on the same host), ``shm`` (the same host), ``fabric``
(libfabric RMA, where a hardware provider such as verbs, efa or cxi is found
or FERRY_FABRIC_PROVIDER names one) and ``tcp`` that reaches the peer and both
memory kinds (``ferry info`` lists them in this order). ``POSIX`` answers
``query_memory`` for files.

Memory: ``DRAM`` (alias ``cpu``) and ``VRAM`` (alias ``cuda``): each row of a
VRAM registration list is registered as Ferry location ``cuda:{dev_id}`` (its
third column; CUDA tensors give their device index), checked against the CUDA
driver (no driver, or a range that is not that device's memory, fails the
whole list). The path follows from the registrations of both sides:
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
``FILE`` memory moves with the ``POSIX`` backend (rows ``(offset, len, fd)``,
a path in the meta field when fd is 0): between this agent's host memory
and its own files, a transfer to its own name, through Ferry's io_uring
file regions (``nixl._files``); ``query_memory`` takes FILE lists. ``GDS``
and ``GDS_MT`` are refused, naming why. ``BLOCK`` and ``OBJ`` lists can be
made; registering or moving them raises nixlNotSupportedError.

NIXL 1.5's strided rows: ``get_xfer_descs`` / ``prep_xfer_dlist`` take an
(N, 5) integer array (addr, len, dev, stride, count) with a ``mem_type``;
each row stands for ``count`` entries ``stride`` bytes apart.

Differences from upstream NIXL (none that vLLM or SGLang rely on):
- Metadata bytes are Ferry's (``get_agent_metadata``): they load into this
  drop-in only, not into upstream NIXL agents (nor theirs into this one).
- A prepared remote list is bound to the peer instance it was checked
  against: after the peer restarted (same address, new process), using it
  raises nixlNotFoundError saying so -- load the new metadata and prepare
  again. A peer that died raises nixlRemoteDisconnectError (Ferry's
  UNAVAILABLE); a transfer that timed out while the peer is still reachable
  raises nixlBackendError (DEADLINE_EXCEEDED).
- ``transfer`` / ``check_xfer_state`` never return "ERR": failures are
  exceptions (as NIXL's native calls raise them).
- Releasing a transfer in flight cancels it: once ``release_xfer_handle``
  returns, none of its bytes land in local memory any more.
- A backend name that was not created, an unknown operation or memory type
  raise ``KeyError`` as upstream does -- as NIXL exception classes that are
  also ``KeyError`` (nixlNotFoundError / nixlInvalidParamError).
- ``prep_mem_view`` raises nixlNotSupportedError (no UCX GPU device API);
  ``estimate_xfer_cost`` raises nixlNotSupportedError (no cost model).
"""

from __future__ import annotations

import pickle
import sys
from enum import Enum
from typing import Any, Optional, Union

import numpy as np

from . import _bindings as nixlBind
from .logging import get_logger
from ._bindings import (DEFAULT_COMM_PORT, NIXL_INIT_AGENT, nixlInvalidParamError,  # noqa: F401
                        nixlNotFoundError, nixlRegDList, nixlRemoteDList, nixlXferDList)

logger = get_logger(__name__)


class nixlUnknownBackendError(nixlNotFoundError, KeyError):
    """A backend name that was not created on the agent (a KeyError, as upstream)."""

    __str__ = nixlNotFoundError.__str__


class nixlUnknownNameError(nixlInvalidParamError, KeyError):
    """An unknown operation or memory type name (a KeyError, as upstream)."""

    __str__ = nixlInvalidParamError.__str__


class _Table(dict):
    """A dict whose missing keys raise `error` naming what exists."""

    def __init__(self, items, error: type, what: str):
        super().__init__(items)
        self._error = error
        self._what = what

    def __missing__(self, key):
        raise self._error(f"unknown {self._what} {key!r}; known: {', '.join(map(str, self))}")


def _is_tensor(obj: Any) -> bool:
    """A torch tensor (without importing torch) or a tensor-like object with
    data_ptr(), numel() and element_size()."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return True
    return callable(getattr(obj, "data_ptr", None)) and callable(getattr(obj, "numel", None))


def _tensor_row(t: Any) -> tuple:
    """(addr, nbytes, dev) and mem type of a contiguous tensor; None if not contiguous."""
    contiguous = getattr(t, "is_contiguous", None)
    if callable(contiguous) and not contiguous():
        return None, None
    device = getattr(t, "device", None)
    kind = getattr(device, "type", str(device)) if device is not None else "cpu"
    nbytes = int(t.numel()) * int(t.element_size())
    if kind == "cuda":
        index = getattr(device, "index", None)
        return (int(t.data_ptr()), nbytes, 0 if index is None else int(index)), "VRAM"
    return (int(t.data_ptr()), nbytes, 0), "DRAM" if kind == "cpu" else kind


class _Handle:
    """An opaque handle of a nixlAgent: ``release()`` frees it (idempotent);
    so does collecting it. Subclasses name the agent's release call."""

    __slots__ = ("_handle", "_agent", "_released")
    _release_call = ""

    def __init__(self, agent, value: int):
        self._handle = int(value)
        self._agent = agent
        self._released = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(0x{self._handle:x}, released={self._released})"

    def release(self):
        if not self._released:
            getattr(self._agent, self._release_call)(self._handle)
            self._released = True

    def __del__(self):
        if not getattr(self, "_released", True):
            try:
                getattr(self._agent, self._release_call)(self._handle)
            except Exception:
                pass  # the agent went first: its engine freed (or cancelled) it


class nixl_prepped_dlist_handle(_Handle):
    """A prepared descriptor list (prep_xfer_dlist)."""

    __slots__ = ()
    _release_call = "releasedDlistH"


class nixl_xfer_handle(_Handle):
    """A transfer (make_prepped_xfer / initialize_xfer); releasing it cancels
    it if in flight."""

    __slots__ = ()
    _release_call = "releaseXferReq"


# Backends are named by opaque ints, as upstream.
nixl_backend_handle = int


class nixl_thread_sync_t(Enum):
    """Thread synchronization modes (Ferry's agents are always thread-safe)."""

    NIXL_THREAD_SYNC_NONE = nixlBind.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = nixlBind.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = nixlBind.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = nixlBind.NIXL_THREAD_SYNC_DEFAULT


class nixl_agent_config:
    """Agent settings, with NIXL's argument names and defaults.

    ``backends`` are instantiated when the agent is made (names that are not
    plugins here are skipped with a warning, as upstream).
    ``enable_listen_thread=True`` serves this agent's metadata on
    ``listen_port`` (0: any free port) for peers' ``fetch_remote_metadata`` /
    ``send_local_metadata``. ``num_threads``, ``enable_prog_thread`` and
    ``sync_mode`` are kept and passed on; Ferry's engine runs its own threads
    (FERRY_IO_THREADS sets them) and is always thread-safe.

    Ferry extension (not in upstream NIXL): ``conf.ferry_options = {...}``
    passes ferry.Engine options (e.g. ``{"transfer_timeout": 2.0}``) to the
    agent's engine; they win over FERRY_* settings.
    """

    def __init__(self, enable_prog_thread: bool = True, enable_listen_thread: bool = False,
                 listen_port: int = DEFAULT_COMM_PORT, capture_telemetry: bool = False,
                 num_threads: int = 0, backends: list[str] = ["UCX"],
                 sync_mode: Optional[nixl_thread_sync_t] = None):
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(
                f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.backends = list(backends)
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.sync_mode = sync_mode
        self.ferry_options: dict = {}

    def __repr__(self):
        return (f"nixl_agent_config(backends={self.backends!r}, capture_telemetry="
                f"{self.capture_telemetry}, listen={self.enable_listen}:{self.port})")


class nixl_agent:
    """A NIXL agent on a Ferry engine; see the module docstring. Every method
    is thread-safe; calls that wait or move data release the GIL."""

    def __init__(self, agent_name: str, nixl_conf: Optional[nixl_agent_config] = None,
                 instantiate_all: bool = False):
        if nixl_conf and instantiate_all:
            instantiate_all = False
            logger.warning("Ignoring instantiate_all based on the provided config in agent creation.")
        if not nixl_conf:
            nixl_conf = nixl_agent_config()
        default_sync = (nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if nixl_conf.enable_listen
                        else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE)
        config = nixlBind.nixlAgentConfig()
        config.useProgThread = nixl_conf.enable_pthread
        config.useListenThread = nixl_conf.enable_listen
        config.listenPort = nixl_conf.port
        config.syncMode = (nixl_conf.sync_mode or default_sync).value
        config.pthrDelay = 0
        config.lthrDelay = 100000
        config.captureTelemetry = nixl_conf.capture_telemetry
        config.ferryOptions = dict(getattr(nixl_conf, "ferry_options", None) or {})
        self.agent = nixlBind.nixlAgent(agent_name, config)

        self.name = agent_name
        self.conf = nixl_conf
        self._leaked_xfer_handles: list[int] = []
        self.notifs: dict[str, list[bytes]] = {}
        self.backends: dict[str, nixl_backend_handle] = _Table(
            {}, nixlUnknownBackendError, f"backend of agent {agent_name!r}")
        self.backend_mems: dict[str, list[str]] = {}
        self.backend_options: dict[str, dict[str, str]] = {}
        self.plugin_list = self.agent.getAvailPlugins()
        self.plugin_b_options: dict[str, dict[str, str]] = {}
        self.plugin_mem_types: dict[str, list[str]] = {}
        for backend in (self.plugin_list if instantiate_all else nixl_conf.backends):
            if backend not in self.plugin_list:
                logger.warning("Skipping backend registration %s due to the missing plugin "
                            "(plugins here: %s).", backend, ", ".join(self.plugin_list))
                continue
            init: dict[str, str] = {}
            if nixl_conf.num_threads > 0:
                init["num_threads"] = str(nixl_conf.num_threads)
            self.create_backend(backend, init)
        self.nixl_mems = _Table({"DRAM": nixlBind.DRAM_SEG, "VRAM": nixlBind.VRAM_SEG,
                                 "FILE": nixlBind.FILE_SEG, "BLOCK": nixlBind.BLK_SEG,
                                 "BLK": nixlBind.BLK_SEG, "OBJ": nixlBind.OBJ_SEG,
                                 "cpu": nixlBind.DRAM_SEG, "cuda": nixlBind.VRAM_SEG},
                                nixlUnknownNameError, "memory type")
        self.nixl_ops = _Table({"WRITE": nixlBind.NIXL_WRITE, "READ": nixlBind.NIXL_READ},
                               nixlUnknownNameError, "operation")
        logger.info("Initialized NIXL agent: %s", agent_name)

    def __del__(self):
        for h in list(getattr(self, "_leaked_xfer_handles", ())):
            try:
                self.agent.releaseXferReq(h)
            except Exception:
                pass
        if getattr(self, "_leaked_xfer_handles", None):
            self._leaked_xfer_handles.clear()

    def _handles(self, backends) -> list:
        return [self.backends[name] for name in backends or ()]

    # ---- plugins and backends -------------------------------------------------------
    def _load_plugin_params(self, plugin: str) -> None:
        if plugin not in self.plugin_list:
            return
        params, mems = self.agent.getPluginParams(plugin)
        self.plugin_b_options[plugin] = params
        self.plugin_mem_types[plugin] = mems

    def get_plugin_list(self) -> list[str]:
        return self.plugin_list

    def get_plugin_mem_types(self, backend: str) -> list[str]:
        """Memory types a plugin serves ([] with a warning for an unknown one)."""
        if backend not in self.plugin_mem_types:
            self._load_plugin_params(backend)
        if backend not in self.plugin_mem_types:
            logger.warning("Plugin %s is not available to get its supported mem types.", backend)
            return []
        return self.plugin_mem_types[backend]

    def get_plugin_params(self, backend: str) -> dict[str, str]:
        """A plugin's parameters ({} with a warning for an unknown one)."""
        if backend not in self.plugin_b_options:
            self._load_plugin_params(backend)
        if backend not in self.plugin_b_options:
            logger.warning("Plugin %s is not available to get its parameters.", backend)
            return {}
        return self.plugin_b_options[backend]

    def get_backend_mem_types(self, backend: str) -> list[str]:
        if backend in self.backend_mems:
            return self.backend_mems[backend]
        logger.warning("Backend %s not instantiated to get its supported mem types.", backend)
        return []

    def get_backend_params(self, backend: str) -> dict[str, str]:
        if backend in self.backend_options:
            return self.backend_options[backend]
        logger.warning("Backend %s not instantiated to get its parameters.", backend)
        return {}

    def create_backend(self, backend: str, initParams: dict[str, str] = {}):
        """Instantiates a backend; an unknown plugin raises nixlNotFoundError
        listing the plugins."""
        self.backends[backend] = self.agent.createBackend(backend, initParams)
        params, mems = self.agent.getBackendParams(self.backends[backend])
        self.backend_mems[backend] = mems
        self.backend_options[backend] = params
        logger.info("Backend %s was instantiated", backend)

    # ---- memory ---------------------------------------------------------------------
    def register_memory(self, reg_list, mem_type: Optional[str] = None, backends: list[str] = [],
                        *, is_sorted: bool = False) -> nixlRegDList:
        """Registers every region of the list (all or nothing) and returns
        the registration list for deregister_memory. (``is_sorted``, which
        older NIXL releases took, is accepted and ignored.)"""
        reg_descs = self.get_reg_descs(reg_list, mem_type)
        if reg_descs is None:
            raise nixlInvalidParamError("register_memory: not a registration list (the "
                                        "logged error says why)")
        self.agent.registerMem(reg_descs, self._handles(backends))
        return reg_descs

    def deregister_memory(self, dereg_list: nixlRegDList, backends: list[str] = []):
        """Unregisters every region of the list (waiting for transfers that
        touch them)."""
        self.agent.deregisterMem(dereg_list, self._handles(backends))

    def query_memory(self, reg_list, backend: str,
                     mem_type: Optional[str] = None) -> list[Optional[dict[str, str]]]:
        """Per row of a FILE list (paths in the meta field): None if the file
        cannot be reached, else {"size", "mode", "mtime"}."""
        reg_descs = self.get_reg_descs(reg_list, mem_type)
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: "
                             f"{list(self.backends.keys())}")
        return self.agent.queryMem(reg_descs, self.backends[backend])

    def make_connection(self, remote_agent: str, backends: list[str] = []):
        """Connects to a loaded remote agent now, so the first transfer does
        not pay for it."""
        self.agent.makeConnection(remote_agent, self._handles(backends))

    # ---- prepared lists and transfers -----------------------------------------------
    def prep_xfer_dlist(self, agent_name: str, xfer_list, mem_type: Optional[str] = None,
                        backends: list[str] = [], *,
                        is_sorted: bool = False) -> nixl_prepped_dlist_handle:
        """Prepares a list once: local (NIXL_INIT_AGENT, "" or the string
        "NIXL_INIT_AGENT"), checked against registered memory; of a loaded
        remote agent, checked against its metadata here (no round trip: a row
        outside its registered memory raises nixlNotFoundError naming it); or
        this agent's own name (loopback)."""
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("prep_xfer_dlist: not a transfer list (the logged "
                                        "error says why)")
        handles = self._handles(backends)
        if isinstance(agent_name, str) and agent_name in ("NIXL_INIT_AGENT", NIXL_INIT_AGENT):
            handle = self.agent.prepXferDlist(descs, handles)
        else:
            handle = self.agent.prepXferDlist(agent_name, descs, handles)
        return nixl_prepped_dlist_handle(self.agent, handle)

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle) -> tuple[int, int, int]:
        duration, err_margin, method = self.agent.estimateXferCost(req_handle._handle)
        method = ("ANALYTICAL_BACKEND" if method == nixlBind.NIXL_COST_ANALYTICAL_BACKEND
                  else "UNKNOWN")
        return duration, err_margin, method

    def make_prepped_xfer(self, operation: str, local_xfer_side: nixl_prepped_dlist_handle,
                          local_indices: Union[list[int], np.ndarray],
                          remote_xfer_side: nixl_prepped_dlist_handle,
                          remote_indices: Union[list[int], np.ndarray], notif_msg: bytes = b"",
                          backends: list[str] = [],
                          skip_desc_merge: bool = False) -> nixl_xfer_handle:
        """A transfer of entry pairs of two prepared lists (lists or 1-D int
        arrays of indices, equally many, pairs equally long). ``notif_msg``
        reaches the remote agent once the data is complete there (for a READ:
        once it is here)."""
        op = self.nixl_ops[operation]
        handle = self.agent.makeXferReq(op, local_xfer_side._handle, local_indices,
                                        remote_xfer_side._handle, remote_indices, notif_msg,
                                        self._handles(backends), skip_desc_merge)
        return nixl_xfer_handle(self.agent, handle)

    def initialize_xfer(self, operation: str, local_descs: nixlXferDList,
                        remote_descs: nixlXferDList, remote_agent: str, notif_msg: bytes = b"",
                        backends: list[str] = []) -> nixl_xfer_handle:
        """Both lists prepared and every entry paired in order (equally many)."""
        op = self.nixl_ops[operation]
        handle = self.agent.createXferReq(op, self._as_xfer(local_descs, "local"),
                                          self._as_xfer(remote_descs, "remote"), remote_agent,
                                          notif_msg, self._handles(backends))
        return nixl_xfer_handle(self.agent, handle)

    def _as_xfer(self, descs, side: str) -> nixlXferDList:
        """A transfer list of what initialize_xfer was given: a nixlXferDList,
        or (a Ferry leniency) tuples, an array or tensors -- their memory kind
        does not matter here: each entry moves as its region was registered."""
        if isinstance(descs, nixlXferDList):
            return descs
        dlist = self.get_xfer_descs(descs, "DRAM")
        if dlist is None:
            raise nixlInvalidParamError(f"initialize_xfer: the {side} list is not a transfer "
                                        "list (the logged error says why)")
        return dlist

    def transfer(self, handle: nixl_xfer_handle, notif_msg: bytes = b"") -> str:
        """Posts the transfer: "DONE" if it already finished, else "PROC".
        Failures raise; reposting one still in flight raises
        nixlRepostActiveError."""
        status = self.agent.postXferReq(handle._handle, notif_msg)
        return "DONE" if status == nixlBind.NIXL_SUCCESS else "PROC"

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        """"DONE" or "PROC"; a failure raises (nixlRemoteDisconnectError when
        the peer is gone; nixlNotFoundError when it was removed)."""
        status = self.agent.getXferStatus(handle._handle)
        return "DONE" if status == nixlBind.NIXL_SUCCESS else "PROC"

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> nixlBind.nixlXferTelemetry:
        """Times (us) and sizes of the last post; nixlNoTelemetryError when
        telemetry is off (NIXL_TELEMETRY_ENABLE, capture_telemetry)."""
        return self.agent.getXferTelemetry(handle._handle)

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        backend = self.agent.queryXferBackend(handle._handle)
        return next(name for name, h in self.backends.items() if h == backend)

    def release_xfer_handle(self, handle: nixl_xfer_handle):
        """Releases the transfer, cancelling it if in flight: once this
        returns none of its bytes land in local memory any more."""
        handle.release()

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle):
        handle.release()

    def prep_mem_view(self, dlist: Union[nixlXferDList, nixlRemoteDList], *,
                      backends: Optional[list[str]] = None) -> int:
        """Needs UCX's GPU device API: raises nixlNotSupportedError here."""
        return self.agent.prepMemView(dlist, self._handles(backends))

    def release_mem_view(self, mvh: int) -> None:
        self.agent.releaseMemView(mvh)

    # ---- notifications -------------------------------------------------------------
    def get_new_notifs(self, backends: list[str] = []) -> dict[str, list[bytes]]:
        """The notifications received since the last call: {sender agent
        name: [message bytes, oldest first]}."""
        return self.agent.getNotifs({}, self._handles(backends))

    def update_notifs(self, backends: list[str] = []) -> dict[str, list[bytes]]:
        """Adds new notifications to ``self.notifs`` and returns it."""
        self.notifs = self.agent.getNotifs(self.notifs, self._handles(backends))
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes,
                               backends: list[str] = [], tag_is_prefix=True) -> bool:
        """True (and that one message removed from ``self.notifs``) if a
        message from the agent starts with `lookup_tag` (contains it, with
        ``tag_is_prefix=False``); an empty tag matches any message."""
        self.notifs = self.agent.getNotifs(self.notifs, self._handles(backends))
        messages = self.notifs.get(remote_agent_name, [])
        for i, msg in enumerate(messages):
            if (msg.startswith(lookup_tag) if tag_is_prefix else lookup_tag in msg):
                del messages[i]
                return True
        return False

    def send_notif(self, remote_agent_name: str, notif_msg: bytes,
                   backend: Optional[str] = None):
        """Sends a message (up to 1 MiB) to an agent (this one too); returns
        once it was acknowledged. Messages from one agent to another arrive
        in order."""
        if backend is None:
            self.agent.genNotif(remote_agent_name, notif_msg)
        else:
            self.agent.genNotif(remote_agent_name, notif_msg, [self.backends[backend]])

    # ---- metadata -------------------------------------------------------------------
    def get_agent_metadata(self) -> bytes:
        """This agent's name, how to reach it and every region registered so
        far, as bytes to ship to peers (add_remote_agent)."""
        return self.agent.getLocalMD()

    def get_partial_agent_metadata(self, descs: nixlRegDList, inc_conn_info: bool = False,
                                   backends: list[str] = []) -> bytes:
        """Metadata that makes only the regions of `descs` visible to the
        agent that loads it (loading more partial metadata adds regions)."""
        return self.agent.getLocalPartialMD(descs, inc_conn_info, self._handles(backends))

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Loads a peer's metadata (no round trip); returns its agent name
        (bytes, as NIXL). Loading it again makes regions it registered since
        visible; a restarted peer's new metadata replaces the old."""
        return self.agent.loadRemoteMD(metadata)

    def remove_remote_agent(self, agent: str):
        """Forgets a remote agent; its handles raise nixlNotFoundError later."""
        self.agent.invalidateRemoteMD(agent)

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT):
        """Sends this agent's metadata to the listener at ip_addr:port, or
        with no address to the central store (etcd: NIXL_ETCD_ENDPOINTS)."""
        self.agent.sendLocalMD(ip_addr, port)

    def send_partial_agent_metadata(self, descs: nixlRegDList, inc_conn_info: bool = False,
                                    backends: list[str] = [], ip_addr: str = "",
                                    port: int = DEFAULT_COMM_PORT, label: str = ""):
        self.agent.sendLocalPartialMD(descs, inc_conn_info, self._handles(backends), ip_addr,
                                      port, label)

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "",
                              port: int = DEFAULT_COMM_PORT, label: str = ""):
        """Asks the listener at ip_addr:port (or etcd) for an agent's
        metadata; it is loaded when it arrives (check_remote_metadata)."""
        self.agent.fetchRemoteMD(remote_agent, ip_addr, port, label)

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT):
        """Tells the listener at ip_addr:port (or etcd) to forget this agent."""
        self.agent.invalidateLocalMD(ip_addr, port)

    def check_remote_metadata(self, agent: str, descs: nixlXferDList = None) -> bool:
        """True if the agent's metadata is loaded and it has not disconnected
        since (and, with `descs`, the rows lie in what it made visible)."""
        if descs is None:
            descs = nixlBind.nixlXferDList(nixlBind.DRAM_SEG)
        elif not isinstance(descs, nixlXferDList):
            descs = self.get_xfer_descs(descs, "DRAM")
            if descs is None:
                return False
        return self.agent.checkRemoteMD(agent, descs) == nixlBind.NIXL_SUCCESS

    # ---- descriptor lists -----------------------------------------------------------
    def _tensor_list(self, cls, descs, fn: str):
        rows, kinds = [], set()
        for t in descs:
            row, kind = _tensor_row(t)
            if row is None:
                logger.error("%s: Please use a list of contiguous Tensors", fn)
                return None
            rows.append(row)
            kinds.add(kind)
        if len(kinds) != 1:
            logger.error("%s: tensors on different devices: make one list per device", fn)
            return None
        kind = kinds.pop()
        if kind not in ("DRAM", "VRAM"):
            logger.error("%s: tensors on %s: only host (DRAM) and CUDA (VRAM) memory move",
                         fn, kind)
            return None
        return cls(self.nixl_mems[kind], np.array(rows, dtype=np.uint64).reshape(-1, 3))

    def _descs(self, cls, descs, mem_type, width: int, fn: str):
        """What get_xfer_descs / get_reg_descs / get_remote_descs share: the
        list, or None with an error logged (naming `fn`) on bad input."""
        name = {nixlXferDList: "transfer", nixlRegDList: "registration"}.get(cls, "remote")
        if isinstance(descs, np.ndarray):
            columns = (3, 5) if cls is nixlXferDList else (3,)
            if mem_type is None:
                logger.error("%s: Please specify a mem type if not using Tensors", fn)
                return None
            if descs.ndim != 2 or descs.shape[1] not in columns:
                logger.error("%s: Nx3%s shape required for a %s descriptor list from a numpy "
                             "array, not %s", fn, " (or Nx5 strided)" if cls is nixlXferDList
                             else "", name, descs.shape)
                return None
            mem = self.nixl_mems[mem_type]
        elif _is_tensor(descs):
            return self._tensor_list(cls, [descs], fn)
        elif isinstance(descs, (list, tuple)) and descs and _is_tensor(descs[0]):
            return self._tensor_list(cls, descs, fn)
        elif isinstance(descs, (list, tuple)) and (not descs or isinstance(descs[0], tuple)):
            if mem_type is None:
                logger.error("%s: Please specify a mem type if not using Tensors", fn)
                return None
            if descs and len(descs[0]) != width:
                logger.error("%s: %d-tuple list needed for a %s list", fn, width, name)
                return None
            mem, descs = self.nixl_mems[mem_type], list(descs)
        else:
            logger.error("%s: cannot make a %s descriptor list of a %s", fn, name,
                         type(descs).__name__)
            return None
        try:
            return cls(mem, descs)
        except (TypeError, ValueError) as e:
            logger.error("%s: %s", fn, e)
            return None

    def get_xfer_descs(self, descs, mem_type: Optional[str] = None, *,
                       is_sorted: bool = False) -> nixlXferDList:
        """A transfer list from (addr, len, dev) tuples or an (N, 3) integer
        array with a mem_type, NIXL 1.5's strided (N, 5) array (addr, len,
        dev, stride, count), a tensor or a list of tensors; a nixlXferDList
        passes through. None (logged) on bad input; an unknown mem_type
        raises KeyError."""
        if isinstance(descs, nixlXferDList):
            return descs
        if isinstance(descs, nixlRegDList):
            logger.error("get_xfer_descs: RegList type detected for transfer, please use XferList")
            return None
        return self._descs(nixlXferDList, descs, mem_type, 3, "get_xfer_descs")

    def get_remote_descs(self, descs: Union[nixlRemoteDList, list[tuple]],
                         mem_type: Optional[str] = None) -> nixlRemoteDList:
        """A list of remote descriptors (addr, len, dev, agent_name) (for
        prep_mem_view)."""
        if isinstance(descs, nixlRemoteDList):
            return descs
        return self._descs(nixlRemoteDList, descs, mem_type, 4, "get_remote_descs")

    def get_reg_descs(self, descs, mem_type: Optional[str] = None, *,
                      is_sorted: bool = False) -> nixlRegDList:
        """A registration list from (addr, len, dev, meta) tuples or an (N, 3)
        integer array with a mem_type, a tensor or a list of tensors; a
        nixlRegDList passes through. None (logged) on bad input."""
        if isinstance(descs, nixlRegDList):
            return descs
        if isinstance(descs, nixlXferDList):
            logger.error("get_reg_descs: XferList type detected for registration, please use RegList")
            return None
        return self._descs(nixlRegDList, descs, mem_type, 4, "get_reg_descs")

    def get_serialized_descs(self, descs) -> bytes:
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs: bytes):
        return pickle.loads(serialized_descs)

    # ---- Ferry extensions ---------------------------------------------------------------
    def close(self) -> None:
        """Shuts the agent down now (listener stopped, transfers in flight
        cancelled). Not in upstream NIXL, where this happens when the agent
        is collected; that happens here too."""
        self.agent.close()

    def __repr__(self):
        return f"<nixl_agent {self.name} {self.agent.engine.peer_id}>"


# Earlier names of this drop-in's handle classes.
nixlPrepDlistHandle = nixl_prepped_dlist_handle
nixlXferHandle = nixl_xfer_handle

__all__ = ["DEFAULT_COMM_PORT", "nixlBind", "nixl_agent", "nixl_agent_config",
           "nixl_backend_handle", "nixl_prepped_dlist_handle", "nixl_thread_sync_t",
           "nixl_xfer_handle", "nixlRegDList", "nixlXferDList", "nixlRemoteDList"]
