"""nixl: a drop-in for NVIDIA NIXL's Python API, running on Ferry.

    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlRemoteDisconnectError
    import nixl._utils, nixl.logging

The whole public surface of NIXL 1.4 (``nixl``, ``nixl._api``,
``nixl._bindings``, ``nixl._utils``, ``nixl.logging``) plus NIXL 1.5's strided
rows; see ``nixl._api`` for the mapping onto Ferry and the few differences,
and python/manifests/ for the names checked against upstream. Built next to
the ``ferry`` package (<build>/python), with a ``nixl-1.5.0.dist-info`` so
that ``importlib.metadata.version("nixl")`` works.

As NIXL's wheel does, ``nixl`` itself exposes every public name of its
submodules (``nixl.nixl_agent``, ``nixl.DRAM_SEG``, ``nixl.get_logger`` ...).
"""

import sys as _sys

from . import _api, _bindings, _utils, logging  # noqa: F401

__version__ = "1.5.0"  # the NIXL API version implemented

for _module in (_api, _bindings, _utils, logging):  # upstream's order: later ones win
    for _name in dir(_module):
        _value = getattr(_module, _name)
        if not _name.startswith("_") and not isinstance(_value, type(_sys)):  # no modules
            setattr(_sys.modules[__name__], _name, _value)
del _module, _name, _value
