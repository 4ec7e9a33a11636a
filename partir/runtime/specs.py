"""From PartIR shardings to JAX's: a sharding lists, per dimension, the mesh axes (major to
minor) the dimension is tiled over; `()` on every dimension means replicated."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from jax.sharding import PartitionSpec

from partir.errors import ProgramError
from partir.ir.types import TensorType

Sharding = tuple[tuple[str, ...], ...]


def normalize(sharding: Sequence[Sequence[str]], local: TensorType, mesh: Mapping[str, int],
              what: str) -> Sharding:
    """The sharding as tuples, checked against the local type and the mesh; `what` names
    the argument or result in errors."""
    dims = tuple(tuple(axes) for axes in sharding)
    if len(dims) != local.rank:
        raise ProgramError(f"{what} has rank {local.rank} but its sharding lists "
                           f"{len(dims)} dimensions: {dims}")
    seen: set[str] = set()
    for axes in dims:
        for axis in axes:
            if axis not in mesh:
                raise ProgramError(f"{what} is sharded over axis {axis!r}, which is not in "
                                   f"the mesh (axes {', '.join(map(repr, mesh))})")
            if axis in seen:
                raise ProgramError(f"{what} is sharded twice over axis {axis!r}: {dims}")
            seen.add(axis)
    return dims


def partition_spec(sharding: Sharding) -> PartitionSpec:
    """`None` for an unsharded dimension, the axis name for one axis, the tuple of names
    (major to minor, which is also JAX's order) for several."""
    return PartitionSpec(*(None if not axes else axes[0] if len(axes) == 1 else axes
                           for axes in sharding))


def global_type(local: TensorType, sharding: Sharding, mesh: Mapping[str, int]) -> TensorType:
    """The global array a device-local value tiles: each dimension times its axes' sizes."""
    return local.with_shape(tuple(n * math.prod(mesh[a] for a in axes)
                                  for n, axes in zip(local.shape, sharding, strict=True)))


def format_sharding(sharding: Sharding) -> str:
    """Shardy-style notation, as everywhere in partir: `[{"B"}, {}]`."""
    return "[" + ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}"
                           for axes in sharding) + "]"
