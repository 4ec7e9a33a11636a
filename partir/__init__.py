"""partir: schedule-based SPMD partitioning of JAX programs (PartIR)."""

from importlib.metadata import version

from partir.api import CorePartition, core_partition, partition
from partir.cancel import CancellationToken, Cancelled
from partir.errors import (
    AlreadyTiledError,
    AxisNotInMeshError,
    DimensionOutOfRangeError,
    IndivisibleDimensionError,
    InvalidTacticError,
    PartitionError,
    TracingError,
    UnknownInputError,
)
from partir.frontend import tag
from partir.jitted import PartitionedFunction, jit
from partir.mesh import Mesh
from partir.metadata import Metadata
from partir.program import Program
from partir.tactics import (
    FIRST_DIVISIBLE_DIM,
    REPLICATED,
    UNKNOWN,
    AutomaticPartition,
    ManualPartition,
)

# pyproject.toml holds the version; the installed package's metadata carries it.
__version__ = version("partir")

__all__ = [
    "FIRST_DIVISIBLE_DIM",
    "REPLICATED",
    "UNKNOWN",
    "AlreadyTiledError",
    "AutomaticPartition",
    "AxisNotInMeshError",
    "CancellationToken",
    "Cancelled",
    "CorePartition",
    "DimensionOutOfRangeError",
    "IndivisibleDimensionError",
    "InvalidTacticError",
    "ManualPartition",
    "Mesh",
    "Metadata",
    "PartitionError",
    "PartitionedFunction",
    "Program",
    "TracingError",
    "UnknownInputError",
    "core_partition",
    "jit",
    "partition",
    "tag",
]
