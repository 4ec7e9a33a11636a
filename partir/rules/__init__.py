"""The primitive catalogue: one declaration per primitive (factor sharding rule, local
parameters, kind and FLOPs) and per PartIR:HLO collective, read by the TMR, the Core
materializer and the simulator.
Each module holds one family; importing the package declares them all."""

from partir.rules import (  # noqa: F401  (each module declares its family)
    collectives,
    control,
    conv,
    edges,
    elementwise,
    fft,
    indexing,
    linalg,
    random,
    reduction,
    shape,
    windows,
)
from partir.rules.catalogue import (
    CATALOGUE,
    Kind,
    OpView,
    Primitive,
    declare,
)
from partir.rules.factors import PASS, REDUCTION, REPLICATION, Factor, ShardingRule

__all__ = ["CATALOGUE", "PASS", "REDUCTION", "REPLICATION", "Factor", "Kind", "OpView",
           "Primitive", "ShardingRule", "declare"]
