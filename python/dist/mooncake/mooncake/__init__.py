"""Ferry's stand-in for Mooncake's ``mooncake`` package (the
mooncake-transfer-engine distribution built from Ferry's python/dist/mooncake).

Only ``mooncake.engine`` is provided: Mooncake's transfer engine, implemented
by Ferry (``ferry.mooncake``). Mooncake Store (``mooncake.store``) and
Mooncake's other modules are not part of it.
"""
