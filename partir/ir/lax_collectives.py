"""PartIR:HLO collectives on device-local arrays, by JAX's named-axis collectives: inside
`jax.shard_map` (the runtime), or under `jax.vmap`s naming the mesh axes (the
interpreters' lockstep runs).

Every collective names mesh axes. Where a dimension is split over several axes (a, b),
a major, the device with coordinates (i_a, i_b) holds chunk i_a * size_b + i_b. JAX's
collectives linearise a tuple of axis names the same way, in the tuple's order (whatever
the mesh's axis order), so a tuple of axes maps directly to JAX's `axis_name`.

`COLLECTIVES` maps each op name to its function, called as `f(*operands, **op.params)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from partir.errors import ProgramError
from partir.ir.collectives import chunk_coordinates, chunk_index, chunk_of
from partir.ir.monoids import MONOIDS

AxesPerDim = Sequence[Sequence[str]]


def _spanning(axes: Sequence[str]) -> tuple[str, ...]:
    """The axes of more than one device: over an axis of one, every collective is the
    identity, and XLA keeps one it is given (as copies and temporaries: a ZeRO schedule
    on a mesh {"batch": 1} used 20% more temporary memory than jax.jit)."""
    return tuple(a for a in axes if lax.axis_size(a) > 1)


def _spanning_per_dim(axes: AxesPerDim) -> tuple[tuple[str, ...], ...]:
    return tuple(_spanning(dim_axes) for dim_axes in axes)


def _chunk(x: Any, dim: int, axes: Sequence[str]) -> int:
    n = lax.axis_size(tuple(axes))
    if x.shape[dim] % n:
        raise ProgramError(f"dimension {dim} of size {x.shape[dim]} cannot be split over "
                           f"axes {tuple(axes)} of total size {n}")
    return x.shape[dim] // n


def all_slice(x: Any, *, axes: AxesPerDim) -> Any:
    """Each device keeps its chunk of every dimension split over axes: local, no
    communication."""
    axes = _spanning_per_dim(axes)
    if not any(axes):
        return x
    # Behind optimization barriers: XLA's simplifier folds a dynamic slice of a dynamic
    # slice into one at the sum of their starts, clamped once, and the folded program is
    # wrong where the other slice's start needs clamping: a user's dynamic_slice whose
    # start JAX clamps (every device then shifts its window by its own amount), or the
    # dynamic slice XLA makes of a single-index scatter that drops out-of-bounds updates
    # (other devices' tiles written). Indexing the dimension split as (chunks, chunk
    # size) instead is folded with dynamic updates into wrong results too.
    x = lax.optimization_barrier(x)
    for dim, dim_axes in enumerate(axes):
        if dim_axes:
            size = _chunk(x, dim, dim_axes)
            x = lax.dynamic_slice_in_dim(x, chunk_index(dim_axes) * size, size, axis=dim)
    return lax.optimization_barrier(x)


def all_gather(x: Any, *, axes: AxesPerDim) -> Any:
    """Concatenates the devices' chunks of every dimension along its axes (inverse of
    `all_slice`)."""
    for dim, dim_axes in enumerate(_spanning_per_dim(axes)):
        # One axis at a time, minor first (the chunks of each major coordinate, then
        # those blocks): JAX's vmap of an all_gather over several axis names fails ("axis
        # size doesn't match"), and the interpreters run a region's collectives so.
        for axis in reversed(dim_axes):
            x = lax.all_gather(x, axis, axis=dim, tiled=True)
    return x


def all_reduce(x: Any, *, axes: Sequence[str], monoid: str) -> Any:
    """Reduces over the devices of `axes` with the monoid; every device gets the result."""
    axes = _spanning(axes)
    if not axes:
        return x
    m = MONOIDS.get(monoid)
    if m is None:
        raise ProgramError(f"unknown reduction monoid {monoid!r}; expected one of "
                           f"{', '.join(MONOIDS)}")
    # `#sum<and>`/`#sum<or>` are logical and only ever combine booleans (the TMR offers
    # them for bool reductions only).
    if not m.accepts(x.dtype):
        raise ProgramError(f"the {monoid!r} monoid is logical and needs a bool operand, "
                           f"got {x.dtype}")
    return m.collective(x, tuple(axes))


def reduce_scatter(x: Any, *, axes: AxesPerDim, monoid: str) -> Any:
    """Reduces over every axis named, then each device keeps its chunk of each dimension
    (the chunk order of `all_slice`)."""
    if monoid != "add":
        # JAX only exposes the additive reduce-scatter (`psum_scatter`); other monoids
        # reduce everywhere, then slice locally, which has the same result.
        named = tuple(a for dim_axes in axes for a in dim_axes)
        return all_slice(all_reduce(x, axes=named, monoid=monoid), axes=axes)
    # One psum_scatter per split dimension: the first reduces over its axes and scatters
    # dimension d; the next reduces those partial sums over its own axes, so after the
    # last one every device holds the full sum over all axes, chunked on every dimension.
    for dim, dim_axes in enumerate(_spanning_per_dim(axes)):
        if dim_axes:
            _chunk(x, dim, dim_axes)  # an indivisible size fails here, with the axes named
            x = lax.psum_scatter(x, tuple(dim_axes), scatter_dimension=dim, tiled=True)
    return x


def all_to_all(x: Any, *, split_dim: int, concat_dim: int, axes: Sequence[str]) -> Any:
    """Splits `split_dim` into one piece per device of `axes`, sends piece j to device j
    and concatenates the received pieces along `concat_dim` in the senders' order."""
    axes = _spanning(axes)
    if not axes:
        return x
    _chunk(x, split_dim, axes)  # an indivisible size fails here, with the axes named
    return lax.all_to_all(x, tuple(axes), split_dim, concat_dim, tiled=True)


def collective_permute(x: Any, *, axes: Sequence[str], pairs: Sequence[tuple[int, int]]
                       ) -> Any:
    """Each (source, target) pair sends the source device's operand to the target (chunk
    indices over `axes`, major to minor); devices no pair targets get zeros. Axes of one
    device add nothing to a chunk index, so JAX's index over the others is the same."""
    spanning = _spanning(axes)
    if not spanning:
        return x if (0, 0) in pairs else lax.full_like(x, 0)
    mesh_axes = jax.sharding.get_abstract_mesh().axis_names
    if not mesh_axes:
        # Under the interpreters' vmaps, whose ppermute batching takes one axis and a
        # whole permutation: every device gathers the chunks and keeps its source's.
        sources = np.full(math.prod(lax.axis_size(a) for a in spanning), -1, np.int32)
        for s, t in pairs:
            sources[t] = s
        source = jnp.asarray(sources)[chunk_index(spanning)]
        chunks = x[None]
        for axis in reversed(spanning):  # one axis at a time, minor first: major outermost
            chunks = lax.all_gather(chunks, axis, axis=0, tiled=True)
        mine = lax.dynamic_index_in_dim(chunks, jnp.maximum(source, 0), keepdims=False)
        return jnp.where(source >= 0, mine, jnp.zeros_like(x))
    # Unlike its other collectives, JAX's ppermute numbers the devices of several axes in
    # the mesh's axis order, not the tuple's: renumber the pairs into that order.
    order = [a for a in mesh_axes if a in spanning]
    if len(spanning) > 1 and order and order != list(spanning):
        sizes = {a: lax.axis_size(a) for a in spanning}
        pairs = [tuple(chunk_of(chunk_coordinates(c, spanning, sizes), order, sizes)
                       for c in pair) for pair in pairs]
    return lax.ppermute(x, spanning, perm=tuple(pairs))


def axis_index(*, axis: str) -> Any:
    """The device's coordinate on a mesh axis."""
    return lax.axis_index(axis)


COLLECTIVES: dict[str, Callable[..., Any]] = {
    "hlo.all_slice": all_slice,
    "hlo.all_gather": all_gather,
    "hlo.all_reduce": all_reduce,
    "hlo.reduce_scatter": reduce_scatter,
    "hlo.all_to_all": all_to_all,
    "hlo.collective_permute": collective_permute,
    "hlo.axis_index": axis_index,
}
