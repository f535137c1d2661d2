"""Ferry: a KV-cache transfer engine.

    import ferry, numpy as np
    with ferry.Engine() as engine:
        buf = np.zeros(1 << 20, np.uint8)
        engine.register(buf)
        seg = engine.open_segment("127.0.0.1:12345")
        engine.write(seg, buf, remote_addr, 4096)

Errors are raised as ferry.FerryError subclasses, one per C++ status code.
``ferry.mooncake.TransferEngine`` is a drop-in for Mooncake's
``mooncake.engine.TransferEngine``.
"""

from . import _ferry
from ._engine import (
    Batch,
    BatchStatus,
    Engine,
    Notification,
    Opcode,
    RemoteRegion,
    Request,
    Segment,
    SegmentInfo,
    TransferState,
    resolve_memory,
)
from ._errors import (
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    FerryError,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)

__version__ = _ferry.version()
WIRE_VERSION_MIN = _ferry.WIRE_VERSION_MIN
WIRE_VERSION_MAX = _ferry.WIRE_VERSION_MAX

__all__ = [
    "AlreadyExists", "Batch", "BatchStatus", "Cancelled", "DataLoss", "DeadlineExceeded",
    "Engine", "FailedPrecondition", "FerryError", "Internal", "InvalidArgument", "NotFound",
    "Notification", "Opcode", "RemoteRegion", "Request", "ResourceExhausted", "Segment",
    "SegmentInfo", "TransferState", "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
    "WIRE_VERSION_MAX", "WIRE_VERSION_MIN", "__version__", "resolve_memory",
]
