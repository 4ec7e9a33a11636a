"""The tile-mapping registry: the loops every op with a factor rule can be rewritten
into, and the loop-index context in which a declaration's `apply` computes the tiles that
need their position."""

from partir.core.tmr.context import LocalContext
from partir.core.tmr.registry import (
    REGISTRY,
    Entry,
    TileMapping,
    factor_mappings,
    localized,
    lookup,
)
from partir.rules import OpView

__all__ = ["REGISTRY", "Entry", "LocalContext", "OpView", "TileMapping", "factor_mappings",
           "localized", "lookup"]
