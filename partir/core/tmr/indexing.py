"""Tiles of gather and scatter-add whose indexed operand dimension is sliced: each handles
only the indices that fall in its chunk (see `partir.rules.indexing`), shifted to the
chunk's start. The other scatters reuse `scatter_local` (`partir.core.tmr.scatter`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from partir.core.actions import Sum
from partir.core.tmr.registry import register_apply
from partir.rules import OpView
from partir.rules.indexing import Mode, window_dims


def _start_columns(indices, start_dims, unit_dims, window, op: OpView, ctx):
    """(global start, largest in-bounds start, start of the local chunk) per index column.

    Unit-window dims may be sliced by a loop, so their starts are global; any other
    indexed dim is local only when taken whole, where local and global bounds are both 0.
    """
    local_shape, global_shape = op.in_types[0].shape, ctx.in_types[0].shape
    cols = []
    for p, d in enumerate(start_dims):
        if d in unit_dims:
            cols.append((indices[..., p], global_shape[d] - 1, ctx.operand_offset(0, d)))
        else:
            cols.append((indices[..., p], local_shape[d] - window[d], 0))
    return cols


def _wide(col):
    # Shifted by a chunk offset, a start can leave a narrow or unsigned index dtype's range.
    return lax.convert_element_type(col, np.int64 if col.dtype.itemsize == 8 else np.int32)


def _local_indices(cols, clip: bool):
    """Starts relative to the local chunk; clamping (CLIP) must use the global bounds."""
    out = []
    for col, hi, off in cols:
        if clip:
            col = jnp.clip(col, 0, min(hi, np.iinfo(col.dtype).max))
        col = _wide(col)
        out.append(col - lax.convert_element_type(off, col.dtype))
    return jnp.stack(out, axis=-1)


def _in_bounds(cols):
    ok = True
    for col, hi, _ in cols:
        col = _wide(col)
        ok = jnp.logical_and(ok, jnp.logical_and(col >= 0, col <= hi))
    return ok


def _unit_dim_sliced(ctx, start_dims, unit_dims) -> bool:
    return any(d in unit_dims and ctx.slices_operand(0, d) for d in start_dims)


# --- gather ------------------------------------------------------------------------------


def gather_apply(op: OpView, prim, operands, ctx):
    dn = op.params["dimension_numbers"]
    operand, indices = operands
    if not _unit_dim_sliced(ctx, dn.start_index_map, dn.collapsed_slice_dims):
        return [prim.bind(operand, indices, **op.params)]
    mode = op.params["mode"]
    cols = _start_columns(indices, dn.start_index_map, dn.collapsed_slice_dims,
                          op.params["slice_sizes"], op, ctx)
    # Rows outside this chunk gather 0, so the #sum over chunks keeps the one real row.
    # Widened unsigned starts need not stay sorted.
    local = prim.bind(operand, _local_indices(cols, clip=mode != Mode.FILL_OR_DROP),
                      **{**op.params, "mode": Mode.FILL_OR_DROP, "fill_value": 0,
                         "indices_are_sorted": False})
    if mode != Mode.FILL_OR_DROP:
        return [local]
    # A row out of the global bounds is 0 in every chunk: its fill value goes in once.
    fill = jnp.logical_and(jnp.logical_not(_in_bounds(cols)), ctx.is_first(0))
    fill = jnp.expand_dims(fill, tuple(dn.offset_dims))
    return [jnp.where(fill, jnp.asarray(op.params["fill_value"], local.dtype), local)]


register_apply("gather", gather_apply)


# --- scatter-add -------------------------------------------------------------------------


def _scatter_windows(dn, operand_shape, updates_shape) -> dict[int, int]:
    """Window size of every operand dim that has an update window dim."""
    dims = window_dims(len(operand_shape), dn.inserted_window_dims, dn.operand_batching_dims)
    return {d: updates_shape[u] for d, u in zip(dims, dn.update_window_dims, strict=True)}


def scatter_local(op: OpView, indices, ctx):
    """(indices, params) of a scatter tile: where an indexed unit-window operand dim is
    sliced, the indices relative to the operand's chunk, out-of-chunk updates dropped."""
    dn = op.params["dimension_numbers"]
    params = op.params
    if _unit_dim_sliced(ctx, dn.scatter_dims_to_operand_dims, dn.inserted_window_dims):
        windows = _scatter_windows(dn, op.in_types[0].shape, op.in_types[2].shape)
        cols = _start_columns(indices, dn.scatter_dims_to_operand_dims,
                              dn.inserted_window_dims, windows, op, ctx)
        # Updates outside this chunk must be dropped, not clamped into it; widened unsigned
        # starts need not stay sorted.
        indices = _local_indices(cols, clip=params["mode"] == Mode.CLIP)
        params = {**params, "mode": Mode.FILL_OR_DROP, "indices_are_sorted": False}
    return indices, params


def scatter_add_apply(op: OpView, prim, operands, ctx):
    operand, indices, updates = operands
    if any(isinstance(lp.results[0], Sum) for lp in ctx.nest):
        # The iterations' results are summed: the operand must be counted once.
        operand = jnp.where(ctx.is_first(0), operand, jnp.zeros_like(operand))
    indices, params = scatter_local(op, indices, ctx)
    return [prim.bind(operand, indices, updates, **params)]


register_apply("scatter-add", scatter_add_apply)
