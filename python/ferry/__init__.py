"""Ferry: a KV-cache transfer engine.

    import ferry, numpy as np
    with ferry.Engine() as engine:
        buf = np.zeros(1 << 20, np.uint8)
        engine.register(buf)
        seg = engine.open_segment("127.0.0.1:12345")
        engine.write(seg, buf, remote_addr, 4096)

Keyword arguments of ferry.Engine are the engine options ``ferry.option_table()``
lists (``ferry info`` prints them); durations in seconds.

Errors are raised as ferry.FerryError subclasses, one per C++ status code.
``ferry.mooncake.TransferEngine`` is a drop-in for Mooncake's
``mooncake.engine.TransferEngine``; the ``nixl`` package built next to this one
is a drop-in for NVIDIA NIXL's agent API (``nixl._api.nixl_agent``).

Prepared transfers: ``engine.prepare(rows[, segment])`` gives a DescList,
``engine.make_transfer(op, local, idx, remote, idx)`` a reusable Transfer.
"""

from . import _ferry
from ._engine import (
    Batch,
    BatchStatus,
    DescList,
    Engine,
    Finished,
    Notification,
    Opcode,
    RemoteRegion,
    Request,
    Segment,
    SegmentInfo,
    Transfer,
    TransferState,
    TransferTelemetry,
    option_table,
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
    "DescList", "Engine", "FailedPrecondition", "FerryError", "Finished", "Internal",
    "InvalidArgument", "NotFound", "Notification", "Opcode", "RemoteRegion", "Request",
    "ResourceExhausted", "Segment", "SegmentInfo", "Transfer", "TransferState",
    "TransferTelemetry", "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
    "WIRE_VERSION_MAX", "WIRE_VERSION_MIN", "__version__", "option_table", "resolve_memory",
]
