"""The tile-mapping registry. Every module of this package holds the entries of one family
of primitives; importing the package imports them all, which registers the entries."""

import importlib
import pkgutil

from partir.core.tmr.context import LocalContext
from partir.core.tmr.registry import (
    REGISTRY,
    Entry,
    OpView,
    TileMapping,
    localized_params,
    lookup,
    register,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("context", "registry"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "Entry", "LocalContext", "OpView", "TileMapping", "localized_params",
           "lookup", "register"]
