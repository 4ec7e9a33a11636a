"""Where a device's chunk of a dimension split over mesh axes lies: said once for the
collectives that slice (`partir.ir.lax_collectives`) and the interpreters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import lax


def chunk_index(axes: Sequence[str]) -> Any:
    """This device's chunk index over `axes`, the first axis major: where a dimension
    split over them starts, in chunks, on the device (inside a shard_map, or under vmaps
    naming the axes)."""
    index: Any = 0
    for axis in axes:
        index = index * lax.axis_size(axis) + lax.axis_index(axis)
    return index
