"""partir: schedule-based SPMD partitioning of JAX programs (PartIR)."""

from importlib.metadata import version

from partir.lazy import exports

__getattr__, __dir__ = exports(__name__, globals(), {
    "partir.api": ("CorePartition", "core_partition", "partition"),
    "partir.cancel": ("CancellationToken", "Cancelled"),
    "partir.errors": ("AlreadyTiledError", "AxisNotInMeshError", "DimensionOutOfRangeError",
                      "IndivisibleDimensionError", "InvalidTacticError", "NotPipelineableError",
                      "NotShardableError",
                      "PartitionError", "SubAxisOverlapError", "TracingError",
                      "UnknownInputError"),
    "partir.frontend": ("tag",),
    "partir.jitted": ("PartitionedFunction", "jit"),
    "partir.mesh": ("Mesh",),
    "partir.metadata": ("Metadata",),
    "partir.program": ("Program",),
    "partir.tactics": ("BARRIER", "FIRST_DIVISIBLE_DIM", "REPLICATED", "UNKNOWN",
                       "AutomaticPartition", "ManualPartition", "PipelinePartition",
                       "ShardingConstraints", "SpecPartition"),
})

# pyproject.toml holds the version; the installed package's metadata carries it.
__version__ = version("partir")

__all__ = [
    "BARRIER",
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
    "NotPipelineableError",
    "NotShardableError",
    "PartitionError",
    "PartitionedFunction",
    "PipelinePartition",
    "Program",
    "ShardingConstraints",
    "SpecPartition",
    "SubAxisOverlapError",
    "TracingError",
    "UnknownInputError",
    "core_partition",
    "jit",
    "partition",
    "tag",
]
