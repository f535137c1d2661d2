"""A drop-in for ``mooncake.engine.TransferEngine`` on top of Ferry.

    from ferry.mooncake import TransferEngine      # or, for unchanged callers:
    import ferry.mooncake; ferry.mooncake.install()
    from mooncake.engine import TransferEngine

Reproduces every method of Mooncake 0.3.12.post1's ``TransferEngine`` (CUDA
build: method names, argument names, defaults and return conventions) and the
module's other names, less its RPC messaging classes and SharedSegment. Differences that
callers can observe, all on the side of reporting more:

* Every failure that Mooncake reduces to an integer is logged once on the
  ``ferry.mooncake`` logger and kept: :meth:`TransferEngine.last_error`.
* Protocols other than "tcp" (e.g. "rdma") run over Ferry's best available
  transport; ``device_name`` is accepted and ignored.
* A sync call's deadline is ``MC_TRANSFER_TIMEOUT`` per request (Mooncake adds
  one nanosecond per byte on top).
* Metadata strings other than "P2PHANDSHAKE" ("etcd://h:p[,h:p]" or a bare
  "h:p" for etcd, "redis://h:p", "http://h:p/metadata") are passed to the
  engine; which of those backends exist depends on the build (see
  ferry::ListMetadataBackends, or ``ferry info``): one it lacks fails
  initialize() with -1 and the reason. With a metadata server an engine's
  segment name is ``local_hostname`` as given, and peers are opened by their
  names. ``MC_REDIS_USERNAME``, ``MC_REDIS_PASSWORD`` and ``MC_REDIS_DB_INDEX``
  apply to a "redis://h:p" string that carries no credentials (or database)
  of its own.
* The MC_* variables are read once, in initialize(). Ferry's own FERRY_*
  variables set the engine's other defaults; what MC_* variables decide
  (transport, timeout, addresses) wins over them.
* ``get_engine()`` returns the ferry.Engine (the module's
  ``InnerTransferEngine`` is ferry.Engine); ``get_engine_ptr()`` returns a
  stable, non-zero opaque handle of it, not a Mooncake ``TransferEngine*``:
  Mooncake Store, which dereferences it, is not part of this drop-in.
* ``transport_hint`` is accepted by every method that takes it and ignored,
  as in Mooncake's CUDA wheel (built without TENT, where it is a no-op):
  Ferry chooses the transport per peer.
* The ``*_on_cuda`` methods order a transfer after the work queued so far on
  a CUDA stream and hold back what is queued after it (Mooncake's semantics),
  with the CUDA driver the engine uses; where there is no usable driver or
  GPU they raise RuntimeError naming why (as Mooncake does when it cannot
  schedule the transfer on the stream). See
  :meth:`TransferEngine.batch_transfer_write_on_cuda`.
* ``close()`` (not in Mooncake) closes the engine without waiting for the
  garbage collector.
* ``register_memory`` / ``batch_register_memory`` take Mooncake's location
  strings: "*" (the default) detects GPU memory from the pointer (a device
  pointer registers as its "cuda:N", anything else as host memory),
  "cuda:N" is GPU memory of device N (checked against the CUDA driver), and
  "cpu" / "cpu:N" (Mooncake's NUMA node) is host memory. A location that does
  not match the memory is refused (-1, the reason in last_error()) instead
  of being registered wrongly; "cuda:N" without a usable CUDA driver is -4
  (FAILED_PRECONDITION, naming why). A peer's GPU memory is reached through
  CUDA IPC (same host) or tcp (the peer stages it); this engine's GPU memory
  is staged through page-locked buffers for a peer's host memory.
* ``ferry_options`` (not in Mooncake): a dict of ferry.Engine options set
  on the instance before initialize() (e.g. ``{"transfer_timeout": 5}``);
  they win over what initialize() derives from its arguments and MC_*.
* Each managed buffer (``allocate_managed_buffer``) is registered on its own,
  exactly the length asked for, and unregistered by ``free_managed_buffer``:
  a peer's transfer that touches the pool outside the buffers currently
  handed out (free space, padding, a freed buffer) is refused.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import importlib.abc
import importlib.metadata
import importlib.util
import ipaddress
import itertools
import json
import logging
import os
import random
import re
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from urllib.parse import quote

from . import _ferry
from ._engine import Engine, Opcode, Segment, TransferState
from ._errors import (
    DeadlineExceeded,
    FailedPrecondition,
    FerryError,
    InvalidArgument,
    Unavailable,
    Unimplemented,
)
from ._pool import ManagedPool

log = logging.getLogger("ferry.mooncake")

#: The Mooncake release whose Python surface this module reproduces.
MOONCAKE_VERSION = "0.3.12.post1"

# ---- mooncake.engine's build flags, answered for Ferry's build --------------------
# In Mooncake each is a compile-time switch (USE_CUDA, USE_EFA, ...); Mooncake's
# x86_64 CUDA wheel has SUPPORT_CUDA and SUPPORT_INTRA_NVLINK on, the rest off.
# Here each says whether Ferry has what callers that test it go on to use.

#: Ferry's CUDA path (GPU memory registration, cuda_ipc, staging, the *_on_cuda
#: methods) is always built: it loads the CUDA driver (libcuda.so.1) at run time
#: and needs no CUDA to build. Whether this machine has a GPU is a run-time matter:
#: a "cuda:N" registration or an *_on_cuda call without one fails, naming why.
SUPPORT_CUDA = True
#: No: Ferry has no EFA transport of its own (protocol "efa" runs on Ferry's best
#: transport; warmup_efa_segment only opens the segment).
SUPPORT_EFA = False
#: No: Ferry has no ROCm/HIP path.
SUPPORT_HIP = False
#: No: Ferry has no multi-node NVLink (fabric memory) transport or allocator.
SUPPORT_MNNVL = False
#: No: Ferry has no Moore Threads MUSA path.
SUPPORT_MUSA = False
#: No: Ferry has no intra-node NVLink transport by that name, nor Mooncake's
#: NVLink allocator for managed buffers (they are host memory here). A peer's GPU
#: memory on the same host is reached through Ferry's cuda_ipc transport under
#: any protocol, which the driver routes over NVLink where the GPUs have it.
SUPPORT_INTRA_NVLINK = False

#: What ``TransferEngine.get_engine()`` returns (Mooncake: its C++ engine).
InnerTransferEngine = Engine


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: ``name`` and ``msg`` (both str), read-write."""

    __slots__ = ("name", "msg")

    def __init__(self, name: str = "", msg: str = ""):
        self.name = name
        self.msg = msg

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


# ---- Ferry errors -> Mooncake ints: the one place they are mapped ----------------
# Values of Mooncake's error.h; every other failure is -1 (ERR_INVALID_ARGUMENT is
# also what Mooncake's Python layer returns for most failures).
_MOONCAKE_CODES = {
    "INVALID_ARGUMENT": -1,  # ERR_INVALID_ARGUMENT
    "RESOURCE_EXHAUSTED": -2,  # ERR_TOO_MANY_REQUESTS
    "NOT_FOUND": -3,  # ERR_ADDRESS_NOT_REGISTERED
    "FAILED_PRECONDITION": -4,  # ERR_BATCH_BUSY
    "ALREADY_EXISTS": -7,  # ERR_ADDRESS_OVERLAPPED
}


def mooncake_code(error: FerryError) -> int:
    """The (negative) Mooncake error code for a Ferry error."""
    return _MOONCAKE_CODES.get(error.code_name, -1)


def check_status_code(error: FerryError) -> int:
    """transfer_check_status's value for a failed batch: -2 timed out, else -1."""
    return -2 if isinstance(error, DeadlineExceeded) else -1


def _returns(on_failure=None):
    """Turns a FerryError raised by the method into Mooncake's return value:
    ``on_failure``, or with on_failure=None the mapped error code. The reason
    is logged once and kept for last_error()."""

    def wrap(fn):
        @functools.wraps(fn)
        def method(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except FerryError as e:
                return self._failed(fn.__name__, e, mooncake_code(e) if on_failure is None else on_failure)

        return method

    return wrap


# ---- MC_* environment variables: read here, once per initialize() ---------------
_LOG_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
               "WARN": logging.WARNING, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
               "FATAL": logging.CRITICAL, "CRITICAL": logging.CRITICAL}

# protocol -> Ferry transport. Mooncake's accelerated protocols run over the
# best transport Ferry has (with no RDMA device Mooncake falls back to TCP too).
_PROTOCOLS = {"tcp": "tcp", "rdma": "auto", "efa": "auto", "nvlink": "auto",
              "nvlink_intra": "auto", "hip": "auto", "cxl": "auto", "barex": "auto",
              "ascend": "auto", "nvmeof": "auto"}


@dataclass(frozen=True)
class Settings:
    force_tcp: bool = False  # MC_FORCE_TCP: set (to anything, even "False") = on
    transfer_timeout: float = 30.0  # MC_TRANSFER_TIMEOUT, seconds, at least 5
    bind_address: str | None = None  # MC_TCP_BIND_ADDRESS: address to bind and advertise
    log_level: int | None = None  # MC_LOG_LEVEL
    metadata_server: str | None = None  # MC_METADATA_SERVER: used when the argument is ""
    handshake_port: int | None = None  # MC_HANDSHAKE_PORT: a fixed rpc (handshake) port
    rpc_port_range: tuple[int, int] | None = None  # MC_MIN_RPC_PORT / MC_MAX_RPC_PORT
    # For a "redis://h:p" metadata string without credentials / database of its own:
    redis_username: str | None = None  # MC_REDIS_USERNAME (an ACL user; needs the password)
    redis_password: str | None = None  # MC_REDIS_PASSWORD
    redis_db_index: int | None = None  # MC_REDIS_DB_INDEX, a database number >= 0

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> "Settings":
        """Reads the MC_* variables; a malformed value is logged and ignored."""

        def number(name, parse, default):
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                return parse(raw.strip())
            except ValueError:
                log.warning("ignoring %s=%r: not a number", name, raw)
                return default

        timeout = number("MC_TRANSFER_TIMEOUT", float, 30.0)
        if timeout < 5:
            log.warning("MC_TRANSFER_TIMEOUT=%s is below the minimum; using 5 s", timeout)
            timeout = 5.0
        level = None
        if env.get("MC_LOG_LEVEL"):
            level = _LOG_LEVELS.get(env["MC_LOG_LEVEL"].strip().upper())
            if level is None:
                log.warning("ignoring MC_LOG_LEVEL=%r", env["MC_LOG_LEVEL"])
        low = number("MC_MIN_RPC_PORT", int, None)
        high = number("MC_MAX_RPC_PORT", int, None)
        port_range = None
        if low is not None or high is not None:
            low, high = low or 15000, high or 17000
            port_range = (low, high) if 0 < low <= high <= 65535 else None
            if port_range is None:
                log.warning("ignoring the rpc port range %s-%s", low, high)
        db_index = number("MC_REDIS_DB_INDEX", int, None)
        if db_index is not None and db_index < 0:
            log.warning("ignoring MC_REDIS_DB_INDEX=%s: not a database number", db_index)
            db_index = None
        return cls(
            force_tcp="MC_FORCE_TCP" in env,
            transfer_timeout=timeout,
            bind_address=env.get("MC_TCP_BIND_ADDRESS") or None,
            log_level=level,
            metadata_server=env.get("MC_METADATA_SERVER") or None,
            handshake_port=number("MC_HANDSHAKE_PORT", int, None),
            rpc_port_range=port_range,
            redis_username=env.get("MC_REDIS_USERNAME") or None,
            redis_password=env.get("MC_REDIS_PASSWORD") or None,
            redis_db_index=db_index,
        )


# ---- Host names and peer ids -----------------------------------------------------
def _location(location) -> str:
    """A Mooncake location string for Ferry: "" / None are "*" (detect)."""
    if location is None:
        return "*"
    if isinstance(location, bytes):
        location = location.decode()
    if not isinstance(location, str):
        raise InvalidArgument(f"a location is a str (\"*\", \"cpu:0\", \"cuda:0\"), not "
                              f"{type(location).__name__}")
    return location.strip() or "*"


def _split_host_port(name: str) -> tuple[str, str | None]:
    """"h", "h:p", "[v6]", "[v6]:p" or a bare IPv6 address -> (host, port or None)."""
    if name.startswith("["):
        host, sep, rest = name[1:].partition("]")
        if not sep:
            raise InvalidArgument(f"unbalanced brackets in {name!r}")
        return host, rest[1:] if rest.startswith(":") else None
    if name.count(":") > 1:  # bare IPv6
        return name, None
    host, sep, port = name.partition(":")
    return host, port if sep else None


def _numeric_host(host: str) -> str:
    """An IP literal for a host name (IPv4 preferred)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            return socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)[0][4][0]
        except (socket.gaierror, IndexError):
            continue
    raise Unavailable(f"cannot resolve the host name {host!r}")


def _peer_id(target_hostname: str) -> str:
    host, port = _split_host_port(target_hostname)
    if not port or not port.isdigit():
        raise InvalidArgument(f"{target_hostname!r} is not \"host:rpc_port\" (the session id of "
                              "a P2PHANDSHAKE engine)")
    ip = _numeric_host(host)
    return f"[{ip}]:{int(port)}" if ":" in ip else f"{ip}:{int(port)}"


def _metadata_url(metadata_server: str, metadata_type: str = "",
                  settings: Settings | None = None) -> str:
    """The engine's connection string for Mooncake's metadata argument."""
    if metadata_server == "P2PHANDSHAKE" or "://" in metadata_server:
        url = metadata_server
    else:
        url = f"{metadata_type or 'etcd'}://{metadata_server}"
    if settings is not None and url.startswith("redis://"):
        url = _redis_url(url, settings)
    return url


def _redis_url(url: str, settings: Settings) -> str:
    """Adds the MC_REDIS_* credentials and database to "redis://h:p" where the
    string has none of its own (what the string says wins)."""
    rest = url[len("redis://"):]
    authority, slash, db = rest.partition("/")
    if "@" not in rest:
        if settings.redis_password:
            user = quote(settings.redis_username or "", safe="")
            authority = f"{user}:{quote(settings.redis_password, safe='')}@{authority}"
        elif settings.redis_username:
            log.warning("ignoring MC_REDIS_USERNAME=%r: MC_REDIS_PASSWORD is not set",
                        settings.redis_username)
    if not db and settings.redis_db_index is not None:
        slash, db = "/", str(settings.redis_db_index)
    return f"redis://{authority}{slash}{db}"


# ---- CUDA streams: what the *_on_cuda methods call --------------------------------
# The driver is loaded with ctypes from the library the engine itself loads
# (libcuda.so.1, or its testing_cuda_driver), so both see the same devices.
_CUDA_DRIVER = "libcuda.so.1"
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # CUhostFn: void (*)(void *userData)


class _StreamDriver:
    """The few CUDA driver calls that order a transfer on a stream."""

    def __init__(self, library: str):
        self.library = library
        try:
            lib = ctypes.CDLL(library)
        except OSError as e:
            raise FailedPrecondition(f"no GPU here: the CUDA driver {library} cannot be "
                                     f"loaded ({e})") from None
        try:
            init, count, sync = lib.cuInit, lib.cuDeviceGetCount, lib.cuStreamSynchronize
        except AttributeError as e:
            raise FailedPrecondition(f"{library} is not a CUDA driver ({e})") from None
        self._error_name = getattr(lib, "cuGetErrorName", None)
        if self._error_name is not None:
            self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        init.argtypes, count.argtypes = [ctypes.c_uint], [ctypes.POINTER(ctypes.c_int)]
        sync.argtypes = [ctypes.c_void_p]
        result = init(0)
        if result != 0:
            raise FailedPrecondition(f"no GPU here: cuInit of {library} failed: "
                                     f"{self.error_text(result)}")
        devices = ctypes.c_int(0)
        result = count(ctypes.byref(devices))
        if result != 0 or devices.value <= 0:
            raise FailedPrecondition(f"no GPU here: the CUDA driver {library} lists no device"
                                     + (f" ({self.error_text(result)})" if result else ""))
        self._synchronize = sync
        # cuLaunchHostFunc (CUDA 10+). A driver without it (the tests' fake) gets
        # the stream synchronized and the transfer made before the call returns.
        self.launch_host_func = getattr(lib, "cuLaunchHostFunc", None)
        if self.launch_host_func is not None:
            self.launch_host_func.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]

    def error_text(self, result: int) -> str:
        name = ctypes.c_char_p()
        if self._error_name is not None and self._error_name(result, ctypes.byref(name)) == 0 \
                and name.value:
            return f"{name.value.decode()} ({result})"
        return f"CUresult {result}"

    def _check(self, result: int, call: str, stream: int) -> None:
        if result != 0:
            raise FailedPrecondition(f"{call} on CUDA stream {stream:#x} failed: "
                                     f"{self.error_text(result)}")

    def synchronize(self, stream: int) -> None:
        self._check(self._synchronize(ctypes.c_void_p(stream or None)), "cuStreamSynchronize",
                    stream)

    def launch(self, stream: int, job) -> None:
        """Queues ``job()`` on the stream: it runs on a driver thread once the
        work queued before it is done, and the stream's later work waits for it."""
        key = next(_job_keys)
        with _jobs_lock:
            _jobs[key] = job
        result = self.launch_host_func(ctypes.c_void_p(stream or None), _host_func,
                                       ctypes.c_void_p(key))
        if result != 0:
            with _jobs_lock:
                _jobs.pop(key, None)
            self._check(result, "cuLaunchHostFunc", stream)


_drivers: dict[str, _StreamDriver] = {}  # library -> driver (a failure is not kept)
_drivers_lock = threading.Lock()
_jobs: dict = {}  # key (the host function's userData) -> job, until it runs
_jobs_lock = threading.Lock()
_job_keys = itertools.count(1)


def _stream_driver(library: str) -> _StreamDriver:
    with _drivers_lock:
        driver = _drivers.get(library)
        if driver is None:
            driver = _drivers[library] = _StreamDriver(library)
        return driver


@_HOST_FN
def _host_func(key):
    """The host function every *_on_cuda call queues; runs its job."""
    with _jobs_lock:
        job = _jobs.pop(key or 0, None)
    if job is not None:
        job()


def _abort_process() -> None:
    """What a failed transfer queued on a stream does (as in Mooncake): nothing
    can be returned to the caller any more, and the stream's later work would
    read wrong data."""
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    os._exit(1)


class TransferEngine:
    """Mooncake's ``TransferEngine``: construct, ``initialize()``, then call.

    Thread-safe; every call that moves bytes releases the GIL while it waits.
    """

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._engine: Engine | None = None
        self._pool: ManagedPool | None = None
        self._lock = threading.Lock()
        self._segments: dict[str, Segment] = {}  # target_hostname as given -> segment
        self._by_name = False  # a metadata server: peers are opened by segment name
        self._batches: dict = {}  # batch id -> ferry.Batch, until its status was collected
        self._local_errors = threading.local()
        self._last_error: str | None = None
        self.ferry_options: dict = {}  # Ferry extension: ferry.Engine options for initialize()

    # ---- Errors -----------------------------------------------------------------
    def _failed(self, method: str, error: FerryError, result):
        text = f"{method}: {error}"
        self._local_errors.text = text
        self._last_error = text
        log.error("%s", text)
        return result

    def last_error(self) -> str | None:
        """Why the last failed call of this thread failed (of any thread, if
        this one had none): "method: CODE: message"; None if nothing failed."""
        return getattr(self._local_errors, "text", None) or self._last_error

    def _require(self) -> Engine:
        engine = self._engine
        if engine is None:
            raise FailedPrecondition("the TransferEngine is not initialized; call initialize()")
        return engine

    # ---- Set-up -----------------------------------------------------------------
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str,
                   device_name: str) -> int:
        return self._initialize("initialize", local_hostname, metadata_server, protocol,
                                device_name, "")

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str,
                       device_name: str, metadata_type: str) -> int:
        return self._initialize("initialize_ext", local_hostname, metadata_server, protocol,
                                device_name, metadata_type)

    def _initialize(self, method, local_hostname, metadata_server, protocol, device_name,
                    metadata_type) -> int:
        try:
            with self._lock:
                self._start(local_hostname, metadata_server, protocol, device_name,
                            metadata_type)
            return 0
        except FerryError as e:
            return self._failed(method, e, -1)

    def _start(self, local_hostname, metadata_server, protocol, device_name, metadata_type):
        if self._engine is not None:
            raise FailedPrecondition(f"already initialized as {self._engine.peer_id}")
        settings = Settings.from_environ(os.environ)
        if settings.log_level is not None:
            log.setLevel(settings.log_level)
        server = metadata_server or settings.metadata_server
        if not server:
            raise InvalidArgument("no metadata server given (use \"P2PHANDSHAKE\")")
        metadata = _metadata_url(server, metadata_type, settings)
        # P2P names peers "host:rpc_port"; with a metadata server, the segment
        # name is local_hostname as given (as in Mooncake).
        by_name = metadata != "P2PHANDSHAKE"
        naming = {"local_name": local_hostname} if by_name else {}
        transport = _PROTOCOLS.get(protocol)
        if transport is None:
            raise InvalidArgument(f"unknown protocol {protocol!r}; known: {sorted(_PROTOCOLS)}")
        if settings.force_tcp:
            transport = "tcp"
        host, _port = _split_host_port(settings.bind_address or local_hostname)
        if not host:
            raise InvalidArgument(f"no host in local_hostname {local_hostname!r}")
        listen_host = _numeric_host(host)
        # The rpc port is the handshake port: fixed, from a range, or any free one.
        # A port in local_hostname is ignored (as Mooncake does in P2P mode).
        if settings.handshake_port is not None:
            ports = [settings.handshake_port]
        elif settings.rpc_port_range is not None:
            low, high = settings.rpc_port_range
            ports = random.sample(range(low, high + 1), min(16, high - low + 1))
        else:
            ports = [0]
        error = None
        extra = dict(getattr(self, "ferry_options", None) or {})
        for port in ports:
            try:
                options = dict(listen_host=listen_host, listen_port=port, metadata=metadata,
                               transport=transport, transfer_timeout=settings.transfer_timeout,
                               **naming)
                options.update(extra)
                engine = Engine(**options)
                break
            except (InvalidArgument, Unimplemented):
                raise
            except FerryError as e:  # e.g. the port is taken: try the next one
                error = e
        else:
            raise error
        self._pool = ManagedPool(engine)
        self._by_name = by_name
        self._engine = engine
        log.info("initialized %s (protocol %r over %s, device %r)", engine.peer_id, protocol,
                 transport, device_name)

    def get_rpc_port(self) -> int:
        """The rpc (handshake) port; the session id is f"{host}:{port}". -1 if
        not initialized."""
        engine = self._engine
        if engine is None:
            return self._failed("get_rpc_port", FailedPrecondition("not initialized"), -1)
        return engine.rpc_port

    def get_engine(self) -> Engine | None:
        """The underlying ferry.Engine (None before initialize())."""
        return self._engine

    def get_engine_ptr(self) -> int:
        """A non-zero int naming the underlying engine, the same for as long as
        it lives (0 before initialize(), as Mooncake's null pointer). Mooncake
        returns its C++ ``TransferEngine*`` for Mooncake Store; this is an
        opaque handle (the address of the Python object wrapping Ferry's C++
        engine), never to be dereferenced as a Mooncake engine."""
        engine = self._engine
        return 0 if engine is None else id(engine._native)

    def close(self) -> None:
        """Not in Mooncake: closes the engine now instead of at garbage collection."""
        with self._lock:
            engine, self._engine = self._engine, None
            self._segments.clear()
            self._batches.clear()
        if engine is not None:
            engine.close()

    # ---- Memory -----------------------------------------------------------------
    @_returns()
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers ``capacity`` bytes at ``buffer_addr``. ``location``: "*"
        (detect: GPU memory of one device as its "cuda:N", else host memory),
        "cuda:N" (GPU memory of device N), "cpu" / "cpu:N" (host memory).
        0, or a negative code: -1 a refused range or location, -4 no usable
        CUDA driver for "cuda:N", -7 overlapping a registered region
        (last_error() says why)."""
        self._require().register(int(buffer_addr), int(capacity), _location(location))
        return 0

    @_returns()
    def unregister_memory(self, buffer_addr: int) -> int:
        self._require().unregister(int(buffer_addr))
        return 0

    @_returns()
    def batch_register_memory(self, buffer_addresses, capacities, location: str = "*") -> int:
        engine = self._require()
        if len(buffer_addresses) != len(capacities):
            raise InvalidArgument(f"{len(buffer_addresses)} addresses but {len(capacities)} "
                                  "capacities")
        engine.register_many([int(a) for a in buffer_addresses], [int(c) for c in capacities],
                             _location(location))
        return 0

    @_returns()
    def batch_unregister_memory(self, buffer_addresses) -> int:
        self._require().unregister_many([int(a) for a in buffer_addresses])
        return 0

    @_returns(0)
    def allocate_managed_buffer(self, length: int) -> int:
        """A buffer of ``length`` bytes from the engine's pool, registered on its
        own (peers reach exactly these bytes); 0 on failure."""
        self._require()
        return self._pool.allocate(int(length))

    @_returns()
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Unregisters the buffer (waiting for transfers in flight that touch it)
        and returns it to the pool; -3 if it is not an allocated managed buffer."""
        self._require()
        size = self._pool.size_of(int(buffer_addr))
        if size is not None and not 0 < length <= size:
            log.warning("free_managed_buffer(%#x, %d): the buffer has %d bytes", buffer_addr,
                        length, size)
        self._pool.free(int(buffer_addr))
        return 0

    @_returns(-1)
    def write_bytes_to_buffer(self, dest_address: int, src_bytes, length: int) -> int:
        _ferry.copy_from_buffer(int(dest_address), src_bytes, int(length))
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        return _ferry.read_bytes(int(source_address), int(length))

    # ---- Peers ------------------------------------------------------------------
    def _segment(self, target_hostname: str) -> Segment:
        """The segment of a peer, opened (handshake) on first use."""
        segment = self._segments.get(target_hostname)
        if segment is None:
            engine = self._require()
            segment = engine.open_segment(target_hostname if self._by_name
                                          else _peer_id(target_hostname))
            self._segments[target_hostname] = segment
        return segment

    @_returns()
    def send_probe(self, peer_server_name: str) -> int:
        """0 if the peer answers a handshake now, negative otherwise."""
        self._require().query_segment(self._segment(peer_server_name))
        return 0

    @_returns(0)
    def get_first_buffer_address(self, segment_name: str) -> int:
        """The start of the first region the peer registered (0 if it has none);
        Ferry's descriptors list regions in registration order."""
        regions = self._require().query_segment(self._segment(segment_name)).regions
        return regions[0].addr if regions else 0

    @_returns(-1)
    def warmup_efa_segment(self, segment_name: str) -> int:
        """Mooncake (EFA builds) connects to the peer ahead of the first
        transfer; here the peer's segment is opened (handshake and route,
        cached for the transfers). 0, or -1 if the peer cannot be reached
        (last_error() says why)."""
        self._segment(segment_name)
        return 0

    def get_local_topology(self, device_name: str | None = None) -> str:
        """{"cpu:<numa node>": [[preferred NICs], [other NICs]]}; no RDMA NICs here."""
        nodes = sorted(int(m.group(1)) for p in Path("/sys/devices/system/node").glob("node*")
                       if (m := re.fullmatch(r"node(\d+)", p.name)))
        return json.dumps({f"cpu:{n}": [[], []] for n in nodes or [0]})

    # ---- Synchronous transfers --------------------------------------------------
    def _sync(self, target_hostname, opcode, buffers, peer_buffer_addresses, lengths, notify=None):
        engine = self._require()
        if not len(buffers) == len(peer_buffer_addresses) == len(lengths):
            raise InvalidArgument(f"{len(buffers)} buffers, {len(peer_buffer_addresses)} peer "
                                  f"addresses and {len(lengths)} lengths")
        segment = self._segment(target_hostname)
        if len(buffers):
            transfer = engine.write_many if opcode == Opcode.WRITE else engine.read_many
            transfer(segment, buffers, peer_buffer_addresses, lengths)
        if notify is not None:
            engine.notify(segment, notify.name, notify.msg.encode("utf-8", "surrogateescape"))
        return 0

    @staticmethod
    def _opcode(opcode) -> Opcode:
        try:
            return Opcode(int(opcode))
        except (ValueError, TypeError):
            raise InvalidArgument(f"unknown opcode {opcode!r}") from None

    @_returns(-1)
    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int, transport_hint: str = "") -> int:
        return self._sync(target_hostname, Opcode.WRITE, [buffer], [peer_buffer_address], [length])

    @_returns(-1)
    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int, transport_hint: str = "") -> int:
        return self._sync(target_hostname, Opcode.READ, [buffer], [peer_buffer_address], [length])

    @_returns(-1)
    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                      length: int, opcode, notify: TransferNotify | None = None,
                      transport_hint: str = "") -> int:
        return self._sync(target_hostname, self._opcode(opcode), [buffer], [peer_buffer_address],
                          [length], notify)

    @_returns(-1)
    def batch_transfer_sync_write(self, target_hostname: str, buffers, peer_buffer_addresses,
                                  lengths, transport_hint: str = "") -> int:
        return self._sync(target_hostname, Opcode.WRITE, buffers, peer_buffer_addresses, lengths)

    @_returns(-1)
    def batch_transfer_sync_read(self, target_hostname: str, buffers, peer_buffer_addresses,
                                 lengths, transport_hint: str = "") -> int:
        return self._sync(target_hostname, Opcode.READ, buffers, peer_buffer_addresses, lengths)

    @_returns(-1)
    def batch_transfer_sync(self, target_hostname: str, buffers, peer_buffer_addresses, lengths,
                            opcode, notify: TransferNotify | None = None,
                            transport_hint: str = "") -> int:
        return self._sync(target_hostname, self._opcode(opcode), buffers, peer_buffer_addresses,
                          lengths, notify)

    # ---- Transfers ordered on a CUDA stream ---------------------------------------
    def transfer_write_on_cuda(self, target_hostname: str, buffer: int,
                               peer_buffer_address: int, length: int, stream_ptr: int = 0,
                               transport_hint: str = "") -> None:
        """Writes once the work queued so far on ``stream_ptr`` is done; see
        :meth:`batch_transfer_write_on_cuda`."""
        self._on_cuda("transfer_write_on_cuda", target_hostname, Opcode.WRITE, [buffer],
                      [peer_buffer_address], [length], stream_ptr)

    def transfer_read_on_cuda(self, target_hostname: str, buffer: int,
                              peer_buffer_address: int, length: int, stream_ptr: int = 0,
                              transport_hint: str = "") -> None:
        """Reads once the work queued so far on ``stream_ptr`` is done; see
        :meth:`batch_transfer_write_on_cuda`."""
        self._on_cuda("transfer_read_on_cuda", target_hostname, Opcode.READ, [buffer],
                      [peer_buffer_address], [length], stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname: str, buffers,
                                     peer_buffer_addresses, lengths, stream_ptr: int = 0,
                                     transport_hint: str = "") -> None:
        """Queues the writes on the CUDA stream ``stream_ptr`` (a ``cudaStream_t``
        as an int, e.g. ``torch.cuda.Stream().cuda_stream``; 0 the default
        stream) and returns: they run once the work queued before them is done,
        and the work queued after them waits for them to complete. None; raises
        RuntimeError (logged, last_error()) when they cannot be queued: the
        peer cannot be opened, the lists differ in length, no usable CUDA
        driver or GPU, or the driver refuses the stream. As in Mooncake, a
        transfer that fails once queued ends the process (exit status 1, the
        reason logged first): the stream's later work would read wrong data.

        The driver runs the transfer from its own thread, which takes the GIL
        to start it: a thread that holds the GIL while it waits for the stream
        would deadlock (PyTorch's synchronizing calls release it). A driver
        without cuLaunchHostFunc gets the stream synchronized and the transfer
        made before the call returns."""
        self._on_cuda("batch_transfer_write_on_cuda", target_hostname, Opcode.WRITE, buffers,
                      peer_buffer_addresses, lengths, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname: str, buffers,
                                    peer_buffer_addresses, lengths, stream_ptr: int = 0,
                                    transport_hint: str = "") -> None:
        """Reads ordered on the CUDA stream ``stream_ptr``; see
        :meth:`batch_transfer_write_on_cuda`."""
        self._on_cuda("batch_transfer_read_on_cuda", target_hostname, Opcode.READ, buffers,
                      peer_buffer_addresses, lengths, stream_ptr)

    def _on_cuda(self, method, target_hostname, opcode, buffers, peer_buffer_addresses, lengths,
                 stream_ptr) -> None:
        try:
            engine = self._require()
            if not len(buffers) == len(peer_buffer_addresses) == len(lengths):
                raise InvalidArgument(f"{len(buffers)} buffers, {len(peer_buffer_addresses)} "
                                      f"peer addresses and {len(lengths)} lengths")
            requests = ([int(a) for a in buffers], [int(a) for a in peer_buffer_addresses],
                        [int(n) for n in lengths])
            stream = int(stream_ptr or 0)
            segment = self._segment(target_hostname)
            driver = _stream_driver(engine.options["testing_cuda_driver"] or _CUDA_DRIVER)

            def transfer():
                if requests[0]:
                    move = engine.write_many if opcode == Opcode.WRITE else engine.read_many
                    move(segment, *requests)

            if driver.launch_host_func is None:
                driver.synchronize(stream)
                transfer()
            else:
                driver.launch(stream, functools.partial(self._stream_job, method, stream,
                                                        transfer))
        except FerryError as e:
            self._failed(method, e, None)
            raise RuntimeError(f"{method}: {e}") from None

    def _stream_job(self, method, stream, transfer) -> None:
        """Runs on the driver's thread, which must make no CUDA call itself:
        the transfer (which may) runs on a thread of its own meanwhile."""
        failure = []

        def work():
            try:
                transfer()
            except FerryError as e:
                failure.append(e)
            except Exception as e:  # noqa: BLE001 - reported, then fatal like a FerryError
                failure.append(FerryError(f"{type(e).__name__}: {e}"))

        worker = threading.Thread(target=work, name="ferry-mooncake-on-cuda", daemon=True)
        worker.start()
        worker.join()
        if failure:
            self._failed(method, failure[0], None)
            log.critical("%s: the transfer queued on CUDA stream %#x failed; ending the process "
                         "as Mooncake does", method, stream)
            _abort_process()

    # ---- Asynchronous transfers -------------------------------------------------
    def _async(self, target_hostname, opcode, buffers, peer_buffer_addresses, lengths) -> int:
        engine = self._require()
        if not len(buffers) == len(peer_buffer_addresses) == len(lengths):
            raise InvalidArgument(f"{len(buffers)} buffers, {len(peer_buffer_addresses)} peer "
                                  f"addresses and {len(lengths)} lengths")
        if not len(buffers):
            raise InvalidArgument("an asynchronous batch needs at least one request")
        segment = self._segment(target_hostname)
        submit = engine.write_async if opcode == Opcode.WRITE else engine.read_async
        batch = submit(segment, buffers, peer_buffer_addresses, lengths)
        with self._lock:
            self._batches[batch.id] = batch
        return batch.id

    @_returns(0)
    def batch_transfer_async_write(self, target_hostname: str, buffers, peer_buffer_addresses,
                                   lengths, transport_hint: str = "") -> int:
        return self._async(target_hostname, Opcode.WRITE, buffers, peer_buffer_addresses, lengths)

    @_returns(0)
    def batch_transfer_async_read(self, target_hostname: str, buffers, peer_buffer_addresses,
                                  lengths, transport_hint: str = "") -> int:
        return self._async(target_hostname, Opcode.READ, buffers, peer_buffer_addresses, lengths)

    @_returns(0)
    def batch_transfer_async(self, target_hostname: str, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint: str = "") -> int:
        return self._async(target_hostname, self._opcode(opcode), buffers, peer_buffer_addresses,
                           lengths)

    @_returns(0)
    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                              length: int, transport_hint: str = "") -> int:
        return self._async(target_hostname, Opcode.WRITE, [buffer], [peer_buffer_address],
                           [length])

    def _take_batch(self, batch_id: int):
        with self._lock:
            batch = self._batches.pop(batch_id, None)
        if batch is None:
            raise InvalidArgument(f"unknown batch id {batch_id!r} (never returned by this engine, "
                                  "or its status was already collected)")
        return batch

    @_returns(-1)
    def get_batch_transfer_status(self, batch_ids) -> int:
        """Waits for every batch, frees them; 0 if all requests completed."""
        errors = []
        for batch_id in batch_ids:
            try:
                batch = self._take_batch(batch_id)
                try:
                    batch.wait()
                finally:
                    batch.free()
            except FerryError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            first = errors[0]
            raise type(first)(f"{len(errors)} of {len(batch_ids)} batches failed; the first: "
                              f"{first.message}", first.code, first.code_name)
        return 0

    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed, 0 in progress, -1 failed, -2 timed out (finished
        batches are freed)."""
        try:
            with self._lock:
                batch = self._batches.get(batch_id)
            if batch is None:
                self._take_batch(batch_id)  # raises, naming the id
            status = batch.status()
            if status.state == TransferState.PENDING:
                return 0
            self._take_batch(batch_id).free()
            if status.state == TransferState.COMPLETED:
                return 1
            return self._failed("transfer_check_status", status.first_error,
                                check_status_code(status.first_error))
        except FerryError as e:
            return self._failed("transfer_check_status", e, -1)

    # ---- Notifications ------------------------------------------------------------
    def get_notifies(self) -> list[TransferNotify]:
        """Drains the notifications received so far, oldest first."""
        engine = self._engine
        if engine is None:
            return []
        return [TransferNotify(n.name, n.message.decode("utf-8", "surrogateescape"))
                for n in engine.notifications()]


# ---- `import mooncake.engine` -> this module ----------------------------------------
_MODULE_NAMES = ("mooncake", "mooncake.engine")
_DISTRIBUTION = "mooncake-transfer-engine"
_EXPORTS = ("TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write",
            "InnerTransferEngine", "SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP",
            "SUPPORT_MNNVL", "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK")


class _Distribution(importlib.metadata.Distribution):
    """Metadata so importlib.metadata.version("mooncake-transfer-engine") works."""

    def read_text(self, filename):
        if filename == "METADATA":
            return (f"Metadata-Version: 2.1\nName: {_DISTRIBUTION}\nVersion: {MOONCAKE_VERSION}\n"
                    f"Summary: Ferry {_ferry.version()} standing in for Mooncake's transfer "
                    "engine\n")
        return None

    def locate_file(self, path):
        return Path(__file__).parent / path


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULE_NAMES:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname == "mooncake")

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = f"Ferry's stand-in for {module.__name__} (see ferry.mooncake)."
        if module.__name__ == "mooncake.engine":
            for name in _EXPORTS:
                setattr(module, name, globals()[name])

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = context.name
        if name is None or re.sub(r"[-_.]+", "-", name).lower() == _DISTRIBUTION:
            yield _Distribution()


_finder = _Finder()


def install():
    """Makes ``import mooncake.engine`` (and the distribution metadata of
    mooncake-transfer-engine) resolve to Ferry, ahead of any real Mooncake.
    Idempotent; returns the ``mooncake.engine`` module."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in _MODULE_NAMES:
        module = sys.modules.get(name)
        if module is not None and module.__spec__ is not None and module.__spec__.loader is not _finder:
            del sys.modules[name]
    return importlib.import_module("mooncake.engine")


def uninstall():
    """Undoes :func:`install`."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in _MODULE_NAMES:
        module = sys.modules.get(name)
        if module is not None and module.__spec__ is not None and module.__spec__.loader is _finder:
            del sys.modules[name]
