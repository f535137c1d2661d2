"""Ferry's exceptions: one class per C++ StatusCode, all under FerryError.

The native layer turns every non-OK ``ferry::Status`` into an instance through
:func:`from_status`, so the code -> class table below is the only place the
two are tied together.
"""

from __future__ import annotations


class FerryError(Exception):
    """A Ferry call failed.

    ``code`` is the C++ ``StatusCode`` value (an int), ``code_name`` its stable
    name ("UNAVAILABLE", ...) and ``message`` the text naming the object at
    fault.
    """

    code: int = 2
    code_name: str = "UNKNOWN"

    def __init__(self, message: str = "", code: int | None = None, code_name: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if code_name is not None:
            self.code_name = code_name

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}" if self.message else self.code_name

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.message, self.code, self.code_name))


def _define(name: str, code: int, code_name: str, doc: str, *extra_bases: type) -> type:
    cls = type(name, (FerryError, *extra_bases), {"code": code, "code_name": code_name, "__doc__": doc})
    cls.__module__ = "ferry"
    return cls


Cancelled = _define("Cancelled", 1, "CANCELLED", "The operation was cancelled (engine shut down).")
Unknown = _define("Unknown", 2, "UNKNOWN", "An error without a more specific code.")
InvalidArgument = _define(
    "InvalidArgument", 3, "INVALID_ARGUMENT",
    "Fix the call: bad address, length, handle or list sizes.", ValueError)
DeadlineExceeded = _define(
    "DeadlineExceeded", 4, "DEADLINE_EXCEEDED",
    "The operation did not finish before its deadline.", TimeoutError)
NotFound = _define("NotFound", 5, "NOT_FOUND", "The named region, segment or batch does not exist.")
AlreadyExists = _define(
    "AlreadyExists", 6, "ALREADY_EXISTS", "The object exists already (e.g. an overlapping region).")
ResourceExhausted = _define(
    "ResourceExhausted", 8, "RESOURCE_EXHAUSTED", "A limit was hit (batch capacity, memory); back off.")
FailedPrecondition = _define(
    "FailedPrecondition", 9, "FAILED_PRECONDITION",
    "The system is not in a state that allows the call (closed engine, batch in flight, "
    "no common wire version).")
Unimplemented = _define(
    "Unimplemented", 12, "UNIMPLEMENTED", "The feature is not available in this build or peer.")
Internal = _define("Internal", 13, "INTERNAL", "A bug in Ferry; please report it.")
Unavailable = _define(
    "Unavailable", 14, "UNAVAILABLE", "Transient: the peer is down or unreachable; retry later.")
DataLoss = _define("DataLoss", 15, "DATA_LOSS", "Bytes were lost or corrupted.")
Unauthenticated = _define(
    "Unauthenticated", 16, "UNAUTHENTICATED",
    "The peer and this engine do not share a cluster secret (FERRY_SECRET_FILE): one has none, "
    "or they differ.", PermissionError)

_BY_CODE: dict[int, type] = {
    cls.code: cls
    for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                ResourceExhausted, FailedPrecondition, Unimplemented, Internal, Unavailable,
                DataLoss, Unauthenticated)
}

ALL = tuple(cls.__name__ for cls in _BY_CODE.values())


def from_status(code: int, code_name: str, message: str) -> FerryError:
    """The exception for a C++ status (called by the native layer)."""
    cls = _BY_CODE.get(code, FerryError)
    return cls(message, code, code_name)
