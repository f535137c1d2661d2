"""nixl: a drop-in for NVIDIA NIXL's Python agent API, running on Ferry.

    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlRemoteDisconnectError

implements the surface vLLM's NixlConnector and SGLang's nixl backend use
(NIXL 1.5: strided rows; see ``nixl._api`` for the mapping onto Ferry and the
few differences). Built next to the ``ferry`` package (<build>/python), with a
``nixl-1.5.0.dist-info`` so that ``importlib.metadata.version("nixl")`` works.
"""

from ._api import nixl_agent, nixl_agent_config  # noqa: F401
from . import _bindings  # noqa: F401

__version__ = "1.5.0"  # the NIXL API version implemented

__all__ = ["nixl_agent", "nixl_agent_config", "__version__"]
