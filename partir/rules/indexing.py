"""Indexing primitives: gather, the scatters, dynamic_slice and dynamic_update_slice.

Dimensions that no index value refers to (batch dimensions of the indices, operand
dimensions taken whole) are pass-through factors. An operand dimension indexed element by
element (the rows of an embedding table) is a factor too: every tile handles only the
indices that fall in its chunk, so for a gather it is a reduction (the tiles' results
add up, rows outside a chunk gathering 0) and for a scatter a pass-through factor. Such
tiles compute from their offsets (each declaration's `apply`): they handle only the
indices that fall in their chunk, shifted to the chunk's start.

Rules may be built on local types with the op's parameters still the global ones: a
window "taken whole" is therefore tested as `window >= operand size`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from partir.ir import Op, Value
from partir.ir.monoids import MONOIDS
from partir.ir.opnames import CONSTANT
from partir.ir.types import tensor_type
from partir.rules.catalogue import Kind, OpView, Primitive, declare, no_flops
from partir.rules.factors import RuleBuilder, ShardingRule

Mode = lax.GatherScatterMode
# Modes whose out-of-bounds behaviour the index-dependent tiles reproduce.
# PROMISE_IN_BOUNDS is taken to behave as XLA does: gathers clamp, scatters drop.
KNOWN_MODES = (Mode.CLIP, Mode.FILL_OR_DROP, Mode.PROMISE_IN_BOUNDS)


def window_dims(rank: int, dropped, batching) -> list[int]:
    return [d for d in range(rank) if d not in dropped and d not in batching]


def localize_slice_sizes(view: OpView) -> dict:
    """Whole-dim windows shrink to the local operand; every other window is unchanged."""
    sizes = tuple(min(s, n) for s, n in zip(view.params["slice_sizes"],
                                            view.in_types[0].shape, strict=True))
    return {**view.params, "slice_sizes": sizes}


def _start_columns(indices, start_dims, unit_dims, window, op: OpView, ctx):
    """(global start, largest in-bounds start, start of the local chunk) per index column.

    Unit-window dims may be sliced, so their starts are global; any other indexed dim is
    local only when taken whole, where local and global bounds are both 0.
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


def gather_rule(view: OpView) -> ShardingRule:
    dn = view.params["dimension_numbers"]
    slice_sizes = view.params["slice_sizes"]
    operand, indices = view.in_types
    out = view.out_types[0]
    indexed_ok = view.params["mode"] in KNOWN_MODES
    b = RuleBuilder([operand.rank, indices.rank], [out.rank])
    batch_out = [d for d in range(out.rank) if d not in dn.offset_dims]
    for j in range(indices.rank - 1):
        if j in dn.start_indices_batching_dims:
            d = dn.operand_batching_dims[dn.start_indices_batching_dims.index(j)]
            b.factor(indices.shape[j], {0: d, 1: j}, {0: batch_out[j]})
        else:
            b.factor(indices.shape[j], {1: j}, {0: batch_out[j]})
    window = window_dims(operand.rank, dn.collapsed_slice_dims, dn.operand_batching_dims)
    for d, o in zip(window, dn.offset_dims, strict=True):
        # A whole window starts at 0 (clamped there, or out of bounds otherwise) both
        # globally and in every chunk.
        if slice_sizes[d] >= operand.shape[d] and (d not in dn.start_index_map or indexed_ok):
            b.factor(out.shape[o], {0: d}, {0: o})
        else:
            b.replicated(operand.shape[d], operands={0: d})
            b.replicated(out.shape[o], results={0: o})
    monoid = "or" if operand.dtype == np.bool_ else "add"
    for d in dn.start_index_map:
        if d in dn.collapsed_slice_dims:
            if indexed_ok:
                b.factor(operand.shape[d], {0: d}, kind="reduction", monoid=monoid)
            else:
                b.replicated(operand.shape[d], operands={0: d})
    for d in range(operand.rank):
        if d in dn.collapsed_slice_dims and d not in dn.start_index_map:
            b.replicated(operand.shape[d], operands={0: d})
    if indices.rank:
        b.replicated(indices.shape[-1], operands={1: indices.rank - 1})
    return b.build()


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


# --- index columns that count along a batch dimension -----------------------------------
#
# `logp[jnp.arange(n), labels]` (the picked log-probabilities of a cross-entropy) and
# `.at[jnp.arange(n)[:, None], idx].set(u)` index an operand dimension with a column of
# the indices that counts along one of their batch dimensions: the indices' row b reads
# the operand's row b. That is a batching dimension written as an index, the form
# `jnp.take_along_axis` and `jax.vmap` write with `operand_batching_dims`, where the rule
# makes it one pass-through factor of the operand and the indices; written as an index
# it is a factor of its own that no batch sharding reaches, and the operand is gathered.
# The canonical form (applied as the frontend emits the op) moves such columns into the
# batching dimensions, as XLA's SPMD partitioner finds its "parallel" dimensions.


def _iota_dim(v: Value, producer) -> int | None:
    """The dimension along which v counts 0, 1, 2, ... (and is constant along the
    others): an iota, broadcast, converted, or normalized as JAX normalizes negative
    indices (`select_n(x < 0, x, x + n)`, which is x where x counts from 0)."""
    op = producer(v)
    if op is None:
        return None
    if op.name == "iota":
        return op.params["dimension"]
    if op.name == "broadcast_in_dim" and len(op.operands) == 1:
        (x,) = op.operands
        k = _iota_dim(x, producer)
        if k is None:
            return None
        d = op.params["broadcast_dimensions"][k]
        return d if x.type.shape[k] == v.type.shape[d] else None
    if op.name == "convert_element_type" and np.issubdtype(v.type.dtype, np.integer):
        return _iota_dim(op.operands[0], producer)
    if op.name == "select_n" and len(op.operands) == 3:
        test = producer(op.operands[0])
        x = op.operands[1]
        if test is not None and test.name == "lt" and test.operands[0] is x and \
                _is_zero(test.operands[1], producer):
            return _iota_dim(x, producer)
    return None


def _is_zero(v: Value, producer) -> bool:
    op = producer(v)
    return op is not None and op.name == CONSTANT and not np.any(op.params["value"])


def _counting_columns(op: Op, producer, index_map: tuple[int, ...],
                      collapsed: tuple[int, ...], batching: list[tuple[int, int]],
                      units: tuple[int, ...]
                      ) -> tuple[list[int], list[tuple[int, int]], list[Value], Op] | None:
    """For a gather or scatter whose indices are a concatenation along the index vector:
    the components (positions in `index_map`) that count along a batch dimension of the
    indices and index a collapsed unit-size operand dim of that dimension's size; the
    batching pairs (operand dim, indices dim) with theirs added, sorted; the parts of the
    concatenation left; and the concatenation. None where there is no such component, or
    nothing else."""
    operand, indices = op.operands[0], op.operands[1]
    vector = indices.type.rank - 1
    made = producer(indices)
    if vector < 0 or made is None or made.name != "concatenate" or \
            made.params["dimension"] != vector:
        return None
    pairs, keep, dropped, k = list(batching), [], [], 0
    for part in made.operands:
        width = part.type.shape[vector]
        j = _iota_dim(part, producer) if width == 1 else None
        d = index_map[k] if j is not None else None
        if j is not None and j != vector and d in collapsed and d in units and \
                operand.type.shape[d] == indices.type.shape[j] and \
                all(d != a and j != b for a, b in pairs):
            pairs.append((d, j))
            dropped.append(k)
        else:
            keep.append(part)
        k += width
    if not dropped or not keep:
        return None
    return dropped, sorted(pairs), keep, made


def _without(items: tuple[int, ...], positions) -> tuple[int, ...]:
    return tuple(x for k, x in enumerate(items) if k not in positions)


def _as_batching(op: Op, producer, index_map: tuple[int, ...], collapsed: tuple[int, ...],
                 batching: list[tuple[int, int]], units: tuple[int, ...], make_dn
                 ) -> list[Op] | None:
    """The op with its counting columns moved into its batching dimensions, after the
    concatenation of the columns left where more than one is:
    `make_dn(collapsed, index_map, operand_batching, indices_batching)` are its new
    dimension numbers."""
    found = _counting_columns(op, producer, index_map, collapsed, batching, units)
    if found is None:
        return None
    dropped, pairs, keep, made = found
    moved = {index_map[k] for k in dropped}
    dn = make_dn(tuple(d for d in collapsed if d not in moved), _without(index_map, dropped),
                 tuple(a for a, _ in pairs), tuple(b for _, b in pairs))
    ops, indices = [], keep[0]
    if len(keep) > 1:
        vector = made.params["dimension"]
        shape = (*made.results[0].type.shape[:vector],
                 sum(p.type.shape[vector] for p in keep))
        indices = Value(tensor_type(shape, made.results[0].type.dtype))
        ops = [Op("concatenate", keep, [indices], {"dimension": vector}, loc=made.loc,
                  prim=made.prim)]
    # The columns left need not be sorted as the whole index vectors were.
    params = {**op.params, "dimension_numbers": dn, "indices_are_sorted": False}
    return [*ops, Op(op.name, [op.operands[0], indices, *op.operands[2:]], op.results,
                     params, op.regions, op.loc, op.prim)]


def gather_canonical(op: Op, producer) -> list[Op] | None:
    dn = op.params["dimension_numbers"]
    return _as_batching(
        op, producer, dn.start_index_map, dn.collapsed_slice_dims,
        list(zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=True)),
        tuple(d for d, n in enumerate(op.params["slice_sizes"]) if n == 1),
        lambda *dims: lax.GatherDimensionNumbers(dn.offset_dims, *dims))


def scatter_canonical(op: Op, producer) -> list[Op] | None:
    dn = op.params["dimension_numbers"]
    # An inserted window dim is a unit window by definition.
    return _as_batching(
        op, producer, dn.scatter_dims_to_operand_dims, dn.inserted_window_dims,
        list(zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims, strict=True)),
        dn.inserted_window_dims,
        lambda *dims: lax.ScatterDimensionNumbers(dn.update_window_dims, *dims))


declare("gather", Primitive(
    Kind.KERNEL, no_flops, gather_rule, localize=localize_slice_sizes, apply=gather_apply,
    canonical=gather_canonical,
    doc="indices batch / operand-and-indices batching / whole window -> tile; indexed "
        "unit-window operand dim -> #sum"))


# --- scatters ----------------------------------------------------------------------------
#
# Batching dims and whole windows pass through for every scatter, as does an indexed
# unit-window operand dim (each chunk of the operand takes the updates whose index falls
# in it: `scatter_local`). The updates' scatter dims differ:
#
# - scatter-add (and scatter-sub, operand - sum of updates) and scatter-min/max: a
#   reduction with the add / min / max monoid. Tiles of the updates each scatter into the
#   operand; for add and sub the operand is kept in one tile only (the apply zeroes it
#   elsewhere), for min and max it may be counted in every tile (they are idempotent).
# - scatter (set) and scatter-mul need replication: tiles of a set write different
#   positions of the operand and no monoid picks, per position, the tile that wrote it
#   (nor the last of several duplicate writes); a product of tiles needs a multiplicative
#   monoid, which no `#sum` action has.

SCATTER_MONOIDS = {"scatter-add": "add", "scatter-sub": "add", "scatter-min": "min",
                   "scatter-max": "max", "scatter": None, "scatter-mul": None}


def scatter_rule(view: OpView) -> ShardingRule:
    monoid = SCATTER_MONOIDS[view.name]
    dn = view.params["dimension_numbers"]
    operand, indices, updates = view.in_types
    indexed_ok = view.params["mode"] in KNOWN_MODES
    b = RuleBuilder([operand.rank, indices.rank, updates.rank], [operand.rank])
    scatter_upd = [u for u in range(updates.rank) if u not in dn.update_window_dims]
    for j in range(indices.rank - 1):
        u = scatter_upd[j]
        if j in dn.scatter_indices_batching_dims:
            d = dn.operand_batching_dims[dn.scatter_indices_batching_dims.index(j)]
            b.factor(operand.shape[d], {0: d, 1: j, 2: u}, {0: d})
        elif monoid is not None:
            b.factor(updates.shape[u], {1: j, 2: u}, kind="reduction", monoid=monoid)
        else:
            b.replicated(updates.shape[u], operands={1: j, 2: u})
    dims = window_dims(operand.rank, dn.inserted_window_dims, dn.operand_batching_dims)
    for d, u in zip(dims, dn.update_window_dims, strict=True):
        # As for gather: a whole window starts at 0 globally and in every chunk.
        if updates.shape[u] == operand.shape[d] and (
                d not in dn.scatter_dims_to_operand_dims or indexed_ok):
            b.factor(operand.shape[d], {0: d, 2: u}, {0: d})
        else:
            b.replicated(operand.shape[d], {0: d}, {0: d})
            b.replicated(updates.shape[u], operands={2: u})
    for d in dn.scatter_dims_to_operand_dims:
        if d in dn.inserted_window_dims:
            if indexed_ok:
                b.factor(operand.shape[d], {0: d}, {0: d})
            else:
                b.replicated(operand.shape[d], {0: d}, {0: d})
    for d in range(operand.rank):
        if d in dn.inserted_window_dims and d not in dn.scatter_dims_to_operand_dims:
            b.replicated(operand.shape[d], {0: d}, {0: d})
    if indices.rank:
        b.replicated(indices.shape[-1], operands={1: indices.rank - 1})
    return b.build()


def scatter_flops(view: OpView, rule: ShardingRule | None) -> float:
    """One combine per update element."""
    return float(view.in_types[2].size if rule is None else rule.elements_of_operand(2))


def _scatter_windows(dn, operand_shape, updates_shape) -> dict[int, int]:
    """Window size of every operand dim that has an update window dim."""
    dims = window_dims(len(operand_shape), dn.inserted_window_dims, dn.operand_batching_dims)
    return {d: updates_shape[u] for d, u in zip(dims, dn.update_window_dims, strict=True)}


def _scatter_tile(op: OpView, prim, operand, indices, updates, ctx):
    """A scatter's tile: where an indexed unit-window operand dim is sliced, the indices
    relative to the operand's chunk, and the updates outside the chunk (or out of the
    global bounds, under FILL_OR_DROP) leaving it unchanged.

    XLA is never given a start to drop: it rewrites a single-index scatter into a dynamic
    update of a dynamic slice of the operand, and folds that slice with the one cutting
    the operand's tile out of a replicated value without clamping the start, so a dropped
    update writes another device's element (openxla/xla#49121; fuzzer seed 8472). An
    update outside goes to a clamped start as its combine's neutral element where it has
    one (add, sub, min, max); otherwise (set, mul) to one extra row past the chunk,
    cropped after."""
    dn = op.params["dimension_numbers"]
    params = op.params
    start_dims = dn.scatter_dims_to_operand_dims
    if not _unit_dim_sliced(ctx, start_dims, dn.inserted_window_dims):
        return prim.bind(operand, indices, updates, **params)
    windows = _scatter_windows(dn, op.in_types[0].shape, op.in_types[2].shape)
    cols = _start_columns(indices, start_dims, dn.inserted_window_dims, windows, op, ctx)
    clip = params["mode"] == Mode.CLIP
    local = _local_indices(cols, clip=clip)
    bounds = [operand.shape[d] - windows.get(d, 1) for d in start_dims]
    inside = True if clip else _in_bounds(cols)
    for p, hi in enumerate(bounds):
        inside = jnp.logical_and(inside, (local[..., p] >= 0) & (local[..., p] <= hi))
    local = jnp.clip(local, 0, jnp.asarray(bounds, local.dtype))
    # Widened unsigned starts need not stay sorted.
    params = {**params, "mode": Mode.FILL_OR_DROP, "indices_are_sorted": False}
    monoid = SCATTER_MONOIDS[op.name]
    if monoid is not None:
        neutral = MONOIDS[monoid].identity(updates.dtype)
        if op.name == "scatter-add" and jnp.issubdtype(updates.dtype, jnp.inexact):
            neutral = -neutral  # x + (-0.0) keeps a -0.0 operand, x + 0.0 would not
        updates = jnp.where(jnp.expand_dims(inside, dn.update_window_dims), updates,
                            neutral)
        return prim.bind(operand, local, updates, **params)
    p = next(p for p, d in enumerate(start_dims)
             if d in dn.inserted_window_dims and ctx.slices_operand(0, d))
    d, n = start_dims[p], operand.shape[start_dims[p]]
    extra = [(0, 0, 0)] * operand.ndim
    extra[d] = (0, 1, 0)
    operand = lax.pad(operand, jnp.zeros((), operand.dtype), extra)
    past = jnp.zeros(len(start_dims), local.dtype).at[p].set(n)
    local = jnp.where(inside[..., None], local, past)
    return lax.slice_in_dim(prim.bind(operand, local, updates, **params), 0, n, axis=d)


def scatter_add_apply(op: OpView, prim, operands, ctx):
    """scatter-add's and scatter-sub's tile: where the tiles' results are summed, the
    operand is kept in one of them only (operand - p0 + (0 - p1) + ... for sub)."""
    operand, indices, updates = operands
    if ctx.sums_result(0):
        operand = jnp.where(ctx.is_first(0), operand, jnp.zeros_like(operand))
    return [_scatter_tile(op, prim, operand, indices, updates, ctx)]


def scatter_apply(op: OpView, prim, operands, ctx):
    """The other scatters' tile: min and max keep the operand in every tile (they are
    idempotent); set and mul have no summed tiles."""
    return [_scatter_tile(op, prim, *operands, ctx)]


_TILES = "batching / whole window / indexed unit-window operand dim -> tile"
declare(("scatter-add", "scatter-sub"), Primitive(
    Kind.KERNEL, scatter_flops, scatter_rule, apply=scatter_add_apply,
    canonical=scatter_canonical,
    doc=f"updates batch -> #sum; {_TILES}"))
declare("scatter-min", Primitive(
    Kind.KERNEL, scatter_flops, scatter_rule, apply=scatter_apply,
    canonical=scatter_canonical,
    doc=f"updates batch -> #sum<min>; {_TILES}"))
declare("scatter-max", Primitive(
    Kind.KERNEL, scatter_flops, scatter_rule, apply=scatter_apply,
    canonical=scatter_canonical,
    doc=f"updates batch -> #sum<max>; {_TILES}"))
declare(("scatter", "scatter-mul"), Primitive(
    Kind.KERNEL, scatter_flops, scatter_rule, apply=scatter_apply,
    canonical=scatter_canonical,
    doc=f"updates batch whole; {_TILES}"))


# --- dynamic_slice / dynamic_update_slice ------------------------------------------------


def dynamic_slice_rule(view: OpView) -> ShardingRule:
    operand = view.in_types[0]
    out = view.out_types[0]
    b = RuleBuilder([t.rank for t in view.in_types], [out.rank])
    for d, (s, n) in enumerate(zip(view.params["slice_sizes"], operand.shape, strict=True)):
        # A whole-dim slice starts at 0 whatever the start index: it is clamped there.
        if s >= n:
            b.factor(out.shape[d], {0: d}, {0: d})
        else:
            b.replicated(n, operands={0: d})
            b.replicated(out.shape[d], results={0: d})
    return b.build()


def dynamic_update_slice_rule(view: OpView) -> ShardingRule:
    operand, update = view.in_types[:2]
    b = RuleBuilder([t.rank for t in view.in_types], [operand.rank])
    for d, (n, m) in enumerate(zip(operand.shape, update.shape, strict=True)):
        # As for dynamic_slice: a whole-dim update starts at 0.
        if n == m:
            b.factor(n, {0: d, 1: d}, {0: d})
        else:
            b.replicated(n, {0: d}, {0: d})
            b.replicated(m, operands={1: d})
    return b.build()


declare("dynamic_slice", Primitive(Kind.MOVEMENT, no_flops, dynamic_slice_rule,
                                   localize=localize_slice_sizes,
                                   doc="whole-dim slice: t_d -> t_d"))
declare("dynamic_update_slice", Primitive(Kind.KERNEL, no_flops, dynamic_update_slice_rule,
                                          doc="whole-dim update: t_d, t_d -> t_d"))
