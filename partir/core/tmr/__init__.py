"""The tile-mapping registry: the loops every op with a factor rule can be rewritten
into, and the index-dependent computation of the tiles that need their position. Every
module but `context` and `registry` registers such computations; importing the package
imports them all."""

import importlib
import pkgutil

from partir.core.tmr.context import LocalContext
from partir.core.tmr.registry import (
    REGISTRY,
    Entry,
    TileMapping,
    factor_mappings,
    localized,
    lookup,
    register_apply,
)
from partir.rules import OpView

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("context", "registry"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "Entry", "LocalContext", "OpView", "TileMapping", "factor_mappings",
           "localized", "lookup", "register_apply"]
