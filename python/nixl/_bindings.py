"""nixl._bindings: the exception classes, constants and telemetry record of
NIXL's native module, as callers import them (``from nixl._bindings import
nixlRemoteDisconnectError``).

Every exception is a ``RuntimeError`` subclass. Messages start with NIXL's
status name (``NIXL_ERR_NOT_FOUND``) followed by Ferry's own text, which names
the peer, row or index, range and reason; the Ferry exception the error came
from, if any, is its ``__cause__``.
"""

from __future__ import annotations

# The local side's name in prep_xfer_dlist (the agent's own name means the same).
NIXL_INIT_AGENT = ""
# NIXL's default port for its metadata listener (nixl_agent_config(listen_port=...)).
DEFAULT_COMM_PORT = 8888

# Memory types (strings, as callers pass them).
DRAM_SEG = "DRAM"
VRAM_SEG = "VRAM"
BLK_SEG = "BLK"
OBJ_SEG = "OBJ"
FILE_SEG = "FILE"


class nixlError(RuntimeError):
    """Base of the classes below (not in upstream NIXL; catch the specific ones)."""

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
                                "Not supported by this build (e.g. GPU memory).")
nixlRemoteDisconnectError = _define("nixlRemoteDisconnectError", "NIXL_ERR_REMOTE_DISCONNECT",
                                    "The remote agent is unreachable (its process died or left).")
nixlCancelledError = _define("nixlCancelledError", "NIXL_ERR_CANCELED",
                             "The transfer was cancelled (released, or the agent shut down).")
nixlNoTelemetryError = _define(
    "nixlNoTelemetryError", "NIXL_ERR_NO_TELEMETRY",
    "No telemetry: the agent was made without capture_telemetry=True, or the transfer never ran.")

ERRORS = (nixlNotPostedError, nixlInvalidParamError, nixlBackendError, nixlNotFoundError,
          nixlMismatchError, nixlNotAllowedError, nixlRepostActiveError, nixlUnknownError,
          nixlNotSupportedError, nixlRemoteDisconnectError, nixlCancelledError,
          nixlNoTelemetryError)


class nixlXferTelemetry:
    """What one post of a transfer took (``get_xfer_telemetry``): ``startTime``
    (us, a steady clock), ``postDuration`` (us), ``xferDuration`` (us, from the
    start to completion; 0 while pending), ``totalBytes``, ``descCount``
    (requests after merging adjacent entries)."""

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


__all__ = [cls.__name__ for cls in ERRORS] + [
    "BLK_SEG", "DEFAULT_COMM_PORT", "DRAM_SEG", "FILE_SEG", "NIXL_INIT_AGENT", "OBJ_SEG",
    "VRAM_SEG", "nixlError", "nixlXferTelemetry"]
