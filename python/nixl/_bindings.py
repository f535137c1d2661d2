"""nixl._bindings: NIXL's lower-level API -- the names of NIXL's native module
(``nixlAgent``, ``nixlAgentConfig``, the descriptor lists, the enums and
status codes, the exception classes, ``nixlXferTelemetry``) -- on Ferry.

``nixl._api`` (the agent most callers use) is built on this module the way
upstream's is on its native one, so code that drives either layer works.
Handles (backends, prepared lists, transfers, memory views) are ints, as in
NIXL; calls return ``NIXL_SUCCESS`` / ``NIXL_IN_PROG`` or raise.

Every exception is a ``RuntimeError`` subclass. Messages start with NIXL's
status name (``NIXL_ERR_NOT_FOUND``) followed by Ferry's own text, which names
the peer, row or index, range and reason; the Ferry exception the error came
from, if any, is its ``__cause__``.
"""

from __future__ import annotations

import enum

# The local side's name in prepXferDlist / prep_xfer_dlist.
NIXL_INIT_AGENT = ""
# NIXL's default port for its metadata listener.
DEFAULT_COMM_PORT = 8888
# prepMemView needs UCX's GPU device API: Ferry has none (prepMemView raises
# nixlNotSupportedError, as NIXL built without it raises nixlBackendError).
HAVE_UCX_GPU_DEVICE_API = False


class nixl_thread_sync_t(enum.IntEnum):
    """Thread-safety modes of an agent (Ferry's agents are always thread-safe)."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


class nixl_mem_t(enum.IntEnum):
    """Memory types: DRAM (host) and VRAM (GPU) move; BLK, OBJ and FILE are
    refused with nixlNotSupportedError (FILE can be queried: queryMem)."""

    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


class nixl_xfer_op_t(enum.IntEnum):
    NIXL_READ = 0
    NIXL_WRITE = 1


class nixl_cost_t(enum.IntEnum):
    NIXL_COST_ANALYTICAL_BACKEND = 0


class nixl_status_t(enum.IntEnum):
    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11
    NIXL_ERR_NO_TELEMETRY = -12


# The enums' members as module names, as NIXL's native module exports them.
for _enum in (nixl_thread_sync_t, nixl_mem_t, nixl_xfer_op_t, nixl_cost_t, nixl_status_t):
    globals().update(_enum.__members__)
del _enum


class nixlError(RuntimeError):
    """Base of the classes below (Ferry's; catch the specific ones)."""

    status = "NIXL_ERR_UNKNOWN"

    def __init__(self, message: str = ""):
        self.message = message
        super().__init__(f"{self.status}: {message}" if message else self.status)

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.message,))


def _define(name: str, status: str, doc: str) -> type:
    cls = type(name, (nixlError,), {"status": status, "__doc__": doc})
    cls.__module__ = __name__
    return cls


nixlNotPostedError = _define("nixlNotPostedError", "NIXL_ERR_NOT_POSTED",
                             "The transfer was never posted.")
nixlInvalidParamError = _define(
    "nixlInvalidParamError", "NIXL_ERR_INVALID_PARAM",
    "Bad arguments: mismatched lengths or counts, an index out of range, an unknown op.")
nixlBackendError = _define("nixlBackendError", "NIXL_ERR_BACKEND",
                           "The transport failed (e.g. a transfer timed out).")
nixlNotFoundError = _define(
    "nixlNotFoundError", "NIXL_ERR_NOT_FOUND",
    "Unknown or removed remote agent, a row outside registered memory, a backend that does "
    "not exist, or a prepared list of a peer instance that restarted.")
nixlMismatchError = _define("nixlMismatchError", "NIXL_ERR_MISMATCH",
                            "The peer's metadata does not match this build (no common wire version).")
nixlNotAllowedError = _define("nixlNotAllowedError", "NIXL_ERR_NOT_ALLOWED",
                              "The call is not allowed in this state.")
nixlRepostActiveError = _define("nixlRepostActiveError", "NIXL_ERR_REPOST_ACTIVE",
                                "The transfer is still in flight; wait for DONE before reposting.")
nixlUnknownError = _define("nixlUnknownError", "NIXL_ERR_UNKNOWN", "An unclassified error.")
nixlNotSupportedError = _define("nixlNotSupportedError", "NIXL_ERR_NOT_SUPPORTED",
                                "Not supported by this build (e.g. BLK or OBJ memory).")
nixlRemoteDisconnectError = _define("nixlRemoteDisconnectError", "NIXL_ERR_REMOTE_DISCONNECT",
                                    "The remote agent is unreachable (its process died or left).")
nixlCancelledError = _define("nixlCancelledError", "NIXL_ERR_CANCELED",
                             "The transfer was cancelled (released, or the agent shut down).")
nixlNoTelemetryError = _define(
    "nixlNoTelemetryError", "NIXL_ERR_NO_TELEMETRY",
    "No telemetry: it is off for this agent (NIXL_TELEMETRY_ENABLE, capture_telemetry), or "
    "the transfer never ran.")

ERRORS = (nixlNotPostedError, nixlInvalidParamError, nixlBackendError, nixlNotFoundError,
          nixlMismatchError, nixlNotAllowedError, nixlRepostActiveError, nixlUnknownError,
          nixlNotSupportedError, nixlRemoteDisconnectError, nixlCancelledError,
          nixlNoTelemetryError)


class nixlXferTelemetry:
    """What one post of a transfer took (``getXferTelemetry``): ``startTime``
    (us, a steady clock), ``postDuration`` (us the post call took, rounded
    up), ``xferDuration`` (us from the start to completion; 0 while pending),
    ``totalBytes``, ``descCount`` (the caller's descriptors)."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount")

    def __init__(self, startTime: int = 0, postDuration: int = 0, xferDuration: int = 0,
                 totalBytes: int = 0, descCount: int = 0):
        self.startTime = startTime
        self.postDuration = postDuration
        self.xferDuration = xferDuration
        self.totalBytes = totalBytes
        self.descCount = descCount

    def __reduce__(self):
        return (type(self), (self.startTime, self.postDuration, self.xferDuration,
                             self.totalBytes, self.descCount))

    def __repr__(self):
        return (f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
                f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, "
                f"descCount={self.descCount})")


class nixlAgentConfig:
    """An agent's settings, as NIXL's native config: positional arguments
    (useProgThread, useListenThread, listenPort, syncMode, numWorkers,
    pthrDelay, lthrDelay, captureTelemetry) and the same attributes.

    Ferry extension: ``ferryOptions`` (dict) passes ferry.Engine options to
    the agent's engine (``nixl_agent_config.ferry_options`` fills it)."""

    def __init__(self, useProgThread: bool = False, useListenThread: bool = False,
                 listenPort: int = DEFAULT_COMM_PORT,
                 syncMode: nixl_thread_sync_t = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT,
                 numWorkers: int = 1, pthrDelay: int = 0, lthrDelay: int = 100000,
                 captureTelemetry: bool = False):
        self.useProgThread = bool(useProgThread)
        self.useListenThread = bool(useListenThread)
        self.listenPort = int(listenPort)
        self.syncMode = nixl_thread_sync_t(syncMode)
        self.numWorkers = int(numWorkers)
        self.pthrDelay = int(pthrDelay)
        self.lthrDelay = int(lthrDelay)
        self.captureTelemetry = bool(captureTelemetry)
        self.etcdWatchTimeout = 5000000  # us, as NIXL's default
        self.ferryOptions: dict = {}

    def __repr__(self):
        return (f"nixlAgentConfig(useListenThread={self.useListenThread}, listenPort="
                f"{self.listenPort}, syncMode={self.syncMode.name}, captureTelemetry="
                f"{self.captureTelemetry})")


from ._dlist import nixlRegDList, nixlRemoteDList, nixlXferDList  # noqa: E402
from ._agent import nixlAgent  # noqa: E402

__all__ = [cls.__name__ for cls in ERRORS] + [
    "DEFAULT_COMM_PORT", "HAVE_UCX_GPU_DEVICE_API", "NIXL_INIT_AGENT", "nixlAgent",
    "nixlAgentConfig", "nixlError", "nixlRegDList", "nixlRemoteDList", "nixlXferDList",
    "nixlXferTelemetry", "nixl_cost_t", "nixl_mem_t", "nixl_status_t", "nixl_thread_sync_t",
    "nixl_xfer_op_t"] + [name for e in (nixl_thread_sync_t, nixl_mem_t, nixl_xfer_op_t,
                                         nixl_cost_t, nixl_status_t) for name in e.__members__]
