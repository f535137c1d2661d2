"""``mooncake.engine`` on Ferry: ``from mooncake.engine import TransferEngine``
gives ``ferry.mooncake.TransferEngine``, in every process, with no
``ferry.mooncake.install()`` call.

The names are those of a CUDA build of Mooncake's ``mooncake.engine`` that
Ferry reproduces (python/manifests/mooncake.json lists them), the very
objects of ``ferry.mooncake``; see its docstring for the differences from
Mooncake.
"""

from ferry.mooncake import (  # noqa: F401
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MUSA,
    InnerTransferEngine,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
)

__all__ = [
    "InnerTransferEngine", "Read", "SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK", "SUPPORT_MNNVL", "SUPPORT_MUSA", "TransferEngine",
    "TransferNotify", "TransferOpcode", "Write",
]
