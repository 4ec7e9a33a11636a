"""JAX's collective primitives that partir puts inside loop bodies (a sliced loop's sync
points), said once for the stages that find them there: the PartIR:HLO collective each
is, and the parameter naming its mesh axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import lax

# JAX primitive -> (the PartIR:HLO collective it is, the parameter naming its axes)
JAX_COLLECTIVES = {"psum": ("all_reduce", "axes"), "all_gather": ("all_gather", "axis_name"),
                   "reduce_scatter": ("reduce_scatter", "axis_name")}


def jaxprs_in(param: Any) -> list[Any]:
    """The jaxprs an op parameter holds (a loop's body, a cond's tuple of branches)."""
    return [x for x in (param if isinstance(param, tuple) else (param,))
            if hasattr(x, "eqns")]


def named_axes(eqn: Any) -> tuple[str, ...]:
    """The mesh axes a collective equation names (positional axes left out)."""
    named = eqn.params[JAX_COLLECTIVES[eqn.primitive.name][1]]
    return tuple(a for a in (named if isinstance(named, tuple) else (named,))
                 if isinstance(a, str))


def chunk_index(axes: Sequence[str]) -> Any:
    """This device's chunk index over `axes`, the first axis major: where a dimension
    split over them starts, in chunks, on the device (inside a shard_map, or a body traced
    with the axes in scope)."""
    index: Any = 0
    for axis in axes:
        index = index * lax.axis_size(axis) + lax.axis_index(axis)
    return index
