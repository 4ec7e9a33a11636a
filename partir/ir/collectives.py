"""Where a device's chunk of a dimension split over mesh axes lies: said once for the
collectives that slice (`partir.ir.lax_collectives`) and the interpreters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def chunk_coordinates(chunk: int, axes: Sequence[str], sizes: Mapping[str, int]
                      ) -> dict[str, int]:
    """The coordinates on `axes` of the device at this chunk index over them (the first
    axis major), given the axes' sizes: `chunk_index`'s inverse, in plain integers."""
    out = {}
    for a in reversed(axes):
        chunk, out[a] = divmod(chunk, sizes[a])
    return out


def chunk_of(coordinates: Mapping[str, int], axes: Sequence[str],
             sizes: Mapping[str, int]) -> int:
    """The chunk index over `axes` (the first axis major) of the device at these
    coordinates: `chunk_index` in plain integers."""
    index = 0
    for a in axes:
        index = index * sizes[a] + coordinates[a]
    return index
