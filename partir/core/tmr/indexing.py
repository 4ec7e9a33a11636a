"""Indexing primitives: gather, scatter-add, dynamic_slice and dynamic_update_slice.

Dimensions that no index value refers to (batch dimensions of the indices, operand
dimensions taken whole) tile like elementwise dimensions. An operand dimension indexed
element by element (the rows of an embedding table) can be sliced as well: every iteration
handles only the indices that fall in its chunk, so a gather sums the iterations and a
scatter tiles them.

Mappings are offered on local types with the op's parameters, which may still be the
global ones: a window "taken whole" is therefore tested as `window >= operand size`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from partir.core.actions import Sum, Tile
from partir.core.tmr.registry import Entry, OpView, TileMapping, register

Mode = lax.GatherScatterMode
# Modes whose out-of-bounds behaviour the index-dependent mappings reproduce.
# PROMISE_IN_BOUNDS is taken to behave as XLA does: gathers clamp, scatters drop.
_KNOWN_MODES = (Mode.CLIP, Mode.FILL_OR_DROP, Mode.PROMISE_IN_BOUNDS)


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


def _unit_dim_sliced(op: OpView, ctx, start_dims, unit_dims) -> bool:
    return any(d in unit_dims and op.in_types[0].shape[d] != ctx.in_types[0].shape[d]
               for d in start_dims)


def localize_slice_sizes(op: OpView) -> dict:
    """Whole-dim windows shrink to the local operand; every other window is unchanged."""
    sizes = tuple(min(s, n) for s, n in zip(op.params["slice_sizes"], op.in_types[0].shape,
                                            strict=True))
    return {**op.params, "slice_sizes": sizes}


def _window_dims(rank: int, dropped, batching) -> list[int]:
    return [d for d in range(rank) if d not in dropped and d not in batching]


# --- gather ------------------------------------------------------------------------------


def gather_mappings(op: OpView):
    dn = op.params["dimension_numbers"]
    slice_sizes = op.params["slice_sizes"]
    operand, indices = op.in_types
    indexed_ok = op.params["mode"] in _KNOWN_MODES
    batch_out = [d for d in range(op.out_types[0].rank) if d not in dn.offset_dims]
    for j in range(indices.rank - 1):
        if j in dn.start_indices_batching_dims:
            d = dn.operand_batching_dims[dn.start_indices_batching_dims.index(j)]
            yield TileMapping((d, j), (Tile(batch_out[j]),))
        else:
            yield TileMapping((None, j), (Tile(batch_out[j]),))
    window = _window_dims(operand.rank, dn.collapsed_slice_dims, dn.operand_batching_dims)
    for d, out in zip(window, dn.offset_dims, strict=True):
        # A whole window starts at 0 (clamped there, or out of bounds otherwise) both
        # globally and in every chunk.
        if slice_sizes[d] >= operand.shape[d] and (d not in dn.start_index_map or indexed_ok):
            yield TileMapping((d, None), (Tile(out),))
    if indexed_ok:
        monoid = "or" if operand.dtype == np.bool_ else "add"
        for d in dn.start_index_map:
            if d in dn.collapsed_slice_dims:
                yield TileMapping((d, None), (Sum(monoid),))


def gather_apply(op: OpView, prim, operands, ctx):
    dn = op.params["dimension_numbers"]
    operand, indices = operands
    if not _unit_dim_sliced(op, ctx, dn.start_index_map, dn.collapsed_slice_dims):
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


register("gather", Entry(gather_mappings, localize=localize_slice_sizes, apply=gather_apply,
                         doc="indices batch / operand-and-indices batching / whole window "
                             "-> tile; indexed unit-window operand dim -> #sum"))


# --- scatter-add -------------------------------------------------------------------------


def _scatter_windows(dn, operand_shape, updates_shape) -> dict[int, int]:
    """Window size of every operand dim that has an update window dim."""
    dims = _window_dims(len(operand_shape), dn.inserted_window_dims, dn.operand_batching_dims)
    return {d: updates_shape[u] for d, u in zip(dims, dn.update_window_dims, strict=True)}


def scatter_add_mappings(op: OpView):
    dn = op.params["dimension_numbers"]
    operand, indices, updates = op.in_types
    indexed_ok = op.params["mode"] in _KNOWN_MODES
    scatter_upd = [u for u in range(updates.rank) if u not in dn.update_window_dims]
    for j in range(indices.rank - 1):
        u = scatter_upd[j]
        if j in dn.scatter_indices_batching_dims:
            d = dn.operand_batching_dims[dn.scatter_indices_batching_dims.index(j)]
            yield TileMapping((d, j, u), (Tile(d),))
        else:
            yield TileMapping((None, j, u), (Sum("add"),))
    dims = _window_dims(operand.rank, dn.inserted_window_dims, dn.operand_batching_dims)
    for d, u in zip(dims, dn.update_window_dims, strict=True):
        # As for gather: a whole window starts at 0 globally and in every chunk.
        if updates.shape[u] == operand.shape[d] and (
                d not in dn.scatter_dims_to_operand_dims or indexed_ok):
            yield TileMapping((d, None, u), (Tile(d),))
    if indexed_ok:
        for d in dn.scatter_dims_to_operand_dims:
            if d in dn.inserted_window_dims:
                yield TileMapping((d, None, None), (Tile(d),))


def scatter_add_apply(op: OpView, prim, operands, ctx):
    dn = op.params["dimension_numbers"]
    operand, indices, updates = operands
    params = op.params
    if any(isinstance(lp.results[0], Sum) for lp in ctx.nest):
        # The iterations' results are summed: the operand must be counted once.
        operand = jnp.where(ctx.is_first(0), operand, jnp.zeros_like(operand))
    if _unit_dim_sliced(op, ctx, dn.scatter_dims_to_operand_dims, dn.inserted_window_dims):
        windows = _scatter_windows(dn, op.in_types[0].shape, op.in_types[2].shape)
        cols = _start_columns(indices, dn.scatter_dims_to_operand_dims,
                              dn.inserted_window_dims, windows, op, ctx)
        # Updates outside this chunk must be dropped, not clamped into it; widened unsigned
        # starts need not stay sorted.
        indices = _local_indices(cols, clip=params["mode"] == Mode.CLIP)
        params = {**params, "mode": Mode.FILL_OR_DROP, "indices_are_sorted": False}
    return [prim.bind(operand, indices, updates, **params)]


register("scatter-add", Entry(scatter_add_mappings, apply=scatter_add_apply,
                              doc="updates batch -> #sum; batching / whole window / "
                                  "indexed unit-window operand dim -> tile"))


# --- dynamic_slice / dynamic_update_slice ------------------------------------------------


def dynamic_slice_mappings(op: OpView):
    operand = op.in_types[0]
    starts = (None,) * (len(op.in_types) - 1)
    for d, (s, n) in enumerate(zip(op.params["slice_sizes"], operand.shape, strict=True)):
        # A whole-dim slice starts at 0 whatever the start index: it is clamped there.
        if s >= n:
            yield TileMapping((d, *starts), (Tile(d),))


def dynamic_update_slice_mappings(op: OpView):
    operand, update = op.in_types[:2]
    starts = (None,) * (len(op.in_types) - 2)
    for d, (n, m) in enumerate(zip(operand.shape, update.shape, strict=True)):
        # As for dynamic_slice: a whole-dim update starts at 0.
        if n == m:
            yield TileMapping((d, d, *starts), (Tile(d),))


register("dynamic_slice", Entry(dynamic_slice_mappings, localize=localize_slice_sizes,
                                doc="whole-dim slice: t_d -> t_d"))
register("dynamic_update_slice", Entry(dynamic_update_slice_mappings,
                                       doc="whole-dim update: t_d, t_d -> t_d"))
