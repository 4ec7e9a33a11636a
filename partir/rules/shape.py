"""Shape primitives: ops that move, select or replicate elements without combining them.

A dimension is a pass-through factor where the op maps a contiguous chunk of the operand
onto a contiguous chunk of the result for every chunk count; dimensions whose elements
are reordered, offset or strided (a reversed, padded or sliced dimension) need
replication. The concatenation axis is tiled on the result alone, each tile cut out of
the whole operands where it lies.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from partir.ir.opnames import CONSTANT
from partir.rules.catalogue import Kind, OpView, Primitive, declare, no_flops
from partir.rules.factors import RuleBuilder, ShardingRule


def _out_shape(view: OpView) -> tuple[int, ...]:
    return tuple(view.out_types[0].shape)


def _result_shape(param: str):
    """The local op's `param` is its result's (local) shape."""
    def localize(view: OpView) -> dict:
        return dict(view.params, **{param: _out_shape(view)})
    return localize


# --- broadcast_in_dim --------------------------------------------------------------------


def broadcast_in_dim_rule(view: OpView) -> ShardingRule:
    out = _out_shape(view)
    b = RuleBuilder([t.rank for t in view.in_types], [len(out)])
    # Extra operands are dynamic shapes, whose tiling we do not describe.
    dynamic = len(view.in_types) != 1
    in_shape = view.in_shapes[0]
    source = {d: i for i, d in enumerate(view.params["broadcast_dimensions"])}
    for d, size in enumerate(out):
        i = source.get(d)
        # A broadcast size-1 dim holds one value for the whole result dim: every tile of
        # the result reads all of it.
        operands = {0: i} if i is not None and in_shape[i] == size else {}
        if dynamic:
            b.replicated(size, operands, {0: d})
        else:
            b.factor(size, operands, {0: d})
    return b.build()


declare("broadcast_in_dim", Primitive(
    Kind.BROADCAST, no_flops, broadcast_in_dim_rule, localize=_result_shape("shape"),
    linear="all", doc="t_i -> t_d for operand dim i broadcast to result dim d of the same size; "
        "⊥ -> t_d for new and size-1-broadcast result dims"))


# --- reshape -----------------------------------------------------------------------------


def _groups(in_shape, out_shape):
    """Minimal runs of non-1 dims on each side with equal products, in order: row-major
    order makes each group an independent block of the reshape."""
    ins = [d for d, s in enumerate(in_shape) if s != 1]
    outs = [d for d, s in enumerate(out_shape) if s != 1]
    a = b = 0
    while a < len(ins) and b < len(outs):
        ga, gb = [ins[a]], [outs[b]]
        pin, pout = in_shape[ins[a]], out_shape[outs[b]]
        a, b = a + 1, b + 1
        while pin != pout:
            if pin < pout:
                ga.append(ins[a])
                pin *= in_shape[ins[a]]
                a += 1
            else:
                gb.append(outs[b])
                pout *= out_shape[outs[b]]
                b += 1
        yield ga, gb


def _refine(sizes_a: list[int], sizes_b: list[int]) -> list[tuple[int, int, int]] | None:
    """The coarsest factors (size, dim index in a, dim index in b) both sides' dims are
    products of, major to minor; None when a dim of one side straddles two of the
    other's without dividing it (e.g. 2x3 -> 3x2)."""
    out = []
    i = j = 0
    ra, rb = sizes_a[0], sizes_b[0]
    while True:
        g = math.gcd(ra, rb)
        if g != ra and g != rb:
            return None
        out.append((g, i, j))
        ra //= g
        rb //= g
        if ra == 1:
            i += 1
            if i == len(sizes_a):
                return out
            ra = sizes_a[i]
        if rb == 1:
            j += 1
            rb = sizes_b[j]


def reshape_rule(view: OpView) -> ShardingRule:
    """Each group of merged or split dims is a sequence of factors (compound dims); a
    group with no common factors keeps one factor for what its major dims share, the
    rest needs replication. A reshape that transposes its operand first (`dimensions`),
    or has dynamic sizes, needs replication."""
    in_shape, out_shape = view.in_shapes[0], _out_shape(view)
    b = RuleBuilder([t.rank for t in view.in_types], [len(out_shape)])
    if (view.params.get("dimensions") is not None or len(view.in_types) != 1
            or 0 in in_shape):
        for d, s in enumerate(in_shape):
            b.replicated(s, operands={0: d})
        for d, s in enumerate(out_shape):
            b.replicated(s, results={0: d})
        return b.build()
    for ga, gb in _groups(in_shape, out_shape):
        sizes_a = [in_shape[d] for d in ga]
        sizes_b = [out_shape[d] for d in gb]
        factors = _refine(sizes_a, sizes_b)
        if factors is not None:
            for size, i, j in factors:
                b.factor(size, {0: ga[i]}, {0: gb[j]})
            continue
        shared = math.gcd(sizes_a[0], sizes_b[0])
        b.factor(shared, {0: ga[0]}, {0: gb[0]})
        b.replicated(sizes_a[0] // shared, operands={0: ga[0]})
        b.replicated(sizes_b[0] // shared, results={0: gb[0]})
        for d in ga[1:]:
            b.replicated(in_shape[d], operands={0: d})
        for d in gb[1:]:
            b.replicated(out_shape[d], results={0: d})
    return b.build()


declare("reshape", Primitive(
    Kind.FREE, no_flops, reshape_rule, localize=_result_shape("new_sizes"), linear="all",
    doc="t_i -> t_o where i and o are the major dims of a group of merged/split dims"))


# --- dims permuted, dropped or reversed --------------------------------------------------


def transpose_rule(view: OpView) -> ShardingRule:
    perm = view.params["permutation"]
    b = RuleBuilder([len(perm)], [len(perm)])
    for d, i in enumerate(perm):
        b.factor(view.in_shapes[0][i], {0: i}, {0: d})
    return b.build()


declare("transpose", Primitive(Kind.MOVEMENT, no_flops, transpose_rule, linear="all",
                               doc="t_perm[d] -> t_d"))


def squeeze_rule(view: OpView) -> ShardingRule:
    shape = view.in_shapes[0]
    removed = set(view.params["dimensions"])
    b = RuleBuilder([len(shape)], [len(shape) - len(removed)])
    for d, i in enumerate(i for i in range(len(shape)) if i not in removed):
        b.factor(shape[i], {0: i}, {0: d})
    return b.build()


declare("squeeze", Primitive(Kind.FREE, no_flops, squeeze_rule, linear="all",
                             doc="t_i -> t_d for every kept operand dim i"))


def _per_dim(view: OpView, whole) -> ShardingRule:
    """Dim d of every operand and result is one pass-through factor where `whole(d)` (the
    op maps it chunk to chunk), else one need-replication factor per tensor having it."""
    b = RuleBuilder([t.rank for t in view.in_types], [t.rank for t in view.out_types])
    for d in range(view.out_types[0].rank):
        if whole(d):
            b.factor(view.out_types[0].shape[d],
                     {i: d for i, t in enumerate(view.in_types) if t.rank},
                     dict.fromkeys(range(len(view.out_types)), d))
            continue
        for i, t in enumerate(view.in_types):
            if t.rank:
                b.replicated(t.shape[d], operands={i: d})
        for k, t in enumerate(view.out_types):
            b.replicated(t.shape[d], results={k: d})
    return b.build()


def rev_rule(view: OpView) -> ShardingRule:
    reversed_dims = set(view.params["dimensions"])
    return _per_dim(view, lambda d: d not in reversed_dims)


declare("rev", Primitive(Kind.MOVEMENT, no_flops, rev_rule,
                         doc="t_d -> t_d for every dim d that is not reversed"))


def concatenate_rule(view: OpView) -> ShardingRule:
    """Every dim but the concatenated one passes through. The concatenated dim of the
    result is a factor of its own that reads the operands whole (`Factor.whole`): device
    k's chunk of the result is cut out of the concatenation at its offset, so a tiled
    operand is gathered (once) and a replicated one only sliced, as GSPMD does; the
    operands' concatenated dims themselves cannot be sliced (a chunk of the result is
    not the concatenation of the operands' chunks)."""
    axis = view.params["dimension"]
    b = RuleBuilder([t.rank for t in view.in_types], [view.out_types[0].rank])
    n = len(view.in_types)
    for d, size in enumerate(view.out_types[0].shape):
        if d != axis:
            b.factor(size, dict.fromkeys(range(n), d), {0: d})
            continue
        for i, t in enumerate(view.in_types):
            b.replicated(t.shape[d], operands={i: d},
                         why="a chunk of the concatenation is not made of the operands' "
                             "chunks: the operand is read whole")
        b.factor(size, results={0: d}, whole=dict.fromkeys(range(n), d))
    return b.build()


def concatenate_apply(op: OpView, prim, operands, ctx):
    # The operands are whole along the dimension (`Factor.whole`), the other dims sliced
    # alike; concatenated, they are the whole result there.
    d = op.params["dimension"]
    whole = prim.bind(*operands, **op.params)
    size = op.out_types[0].shape[d]
    if whole.shape[d] == size:
        return [whole]
    return [ctx.cut(whole, 0, d, size)]


declare("concatenate", Primitive(
    Kind.MOVEMENT, no_flops, concatenate_rule, apply=concatenate_apply, linear="all",
    doc="t_d, ..., t_d -> t_d for every d but the concatenated one; ⊥, ..., ⊥ -> t_d "
        "for the concatenated one, each tile cut out of the whole operands at its offset"))


def pad_rule(view: OpView) -> ShardingRule:
    # The padding value is a scalar: _per_dim leaves it out of every factor.
    config = view.params["padding_config"]
    return _per_dim(view, lambda d: tuple(config[d]) == (0, 0, 0))


declare("pad", Primitive(Kind.MOVEMENT, no_flops, pad_rule,
                         doc="t_d, ⊥ -> t_d for every unpadded dim d"))


def split_rule(view: OpView) -> ShardingRule:
    return _per_dim(view, lambda d: d != view.params["axis"])


declare("split", Primitive(Kind.MOVEMENT, no_flops, split_rule,
                           doc="t_d -> t_d, ..., t_d for every d but the split axis"))


def _stacked_why(n: int) -> str:
    return (f"the stacking axis's {n} entries are different operands (results): a tile of "
            f"it would take other operands on each device")


def stack_rule(view: OpView) -> ShardingRule:
    """The operands' dims pass through to the result's other dims; the new dim indexes
    the operands, so it needs replication."""
    axis = view.params["axis"]
    shape = view.in_shapes[0]
    n = len(view.in_types)
    b = RuleBuilder([len(shape)] * n, [len(shape) + 1])
    for i, size in enumerate(shape):
        b.factor(size, dict.fromkeys(range(n), i), {0: i + (i >= axis)})
    b.replicated(n, results={0: axis}, why=_stacked_why(n))
    return b.build()


declare("stack", Primitive(Kind.MOVEMENT, no_flops, stack_rule,
                           doc="t_d, ..., t_d -> t_d' for every operand dim d (d' past the "
                               "new dim); the new dim needs replication"))


def unstack_rule(view: OpView) -> ShardingRule:
    """stack's transpose: the operand's other dims pass through to every result."""
    axis = view.params["axis"]
    shape = view.in_shapes[0]
    n = len(view.out_types)
    b = RuleBuilder([len(shape)], [len(shape) - 1] * n)
    for d, size in enumerate(shape):
        if d == axis:
            b.replicated(size, operands={0: d}, why=_stacked_why(n))
        else:
            b.factor(size, {0: d}, dict.fromkeys(range(n), d - (d > axis)))
    return b.build()


declare("unstack", Primitive(Kind.MOVEMENT, no_flops, unstack_rule,
                             doc="t_d -> t_d', ..., t_d' for every dim d but the unstacked "
                                 "one, which needs replication"))


# --- tile ---------------------------------------------------------------------------------


def tile_rule(view: OpView) -> ShardingRule:
    """A tiled dim of the result is the compound (repeats, size), repeats major: copy j of
    the operand fills the j-th chunk. The operand's dim is the minor factor (size); the
    repeats factor is the result's alone, so a tile of it is whole copies of the operand
    (Shardy's rule for a broadcast that is then reshaped). A size-1 operand dim is
    broadcast (no factor), as in broadcast_in_dim."""
    in_shape, out_shape = view.in_shapes[0], _out_shape(view)
    b = RuleBuilder([len(in_shape)], [len(out_shape)])
    for d, (size, reps) in enumerate(zip(in_shape, view.params["reps"], strict=True)):
        if size * reps == 0:
            b.replicated(size, operands={0: d})
            b.replicated(out_shape[d], results={0: d})
            continue
        if reps != 1:
            b.factor(reps, results={0: d})
        if size != 1 or reps == 1:
            b.factor(size, {0: d}, {0: d})
    return b.build()


def tile_localize(view: OpView) -> dict:
    """The local repeats: the local result's dim over the local operand's."""
    reps = tuple(o // i if i else r for r, i, o in zip(
        view.params["reps"], view.in_shapes[0], _out_shape(view), strict=True))
    return dict(view.params, reps=reps)


declare("tile", Primitive(Kind.BROADCAST, no_flops, tile_rule, localize=tile_localize,
                          doc="t_d -> (r_d, t_d) for every dim d repeated r_d times; "
                              "r_d is the result's alone"))


# --- slice -------------------------------------------------------------------------------


def whole_slice_dims(view: OpView) -> list[int]:
    """Dims the slice takes whole: start 0, stride 1 and as large as the operand.

    Sizes rather than `limit_indices` are compared since the params may be the global
    ones while the types are local.
    """
    strides = view.params["strides"] or (1,) * view.in_types[0].rank
    return [d for d, (start, stride, n, m) in enumerate(zip(
        view.params["start_indices"], strides, view.in_shapes[0], _out_shape(view),
        strict=True))
        if start == 0 and stride == 1 and n == m]


def slice_rule(view: OpView) -> ShardingRule:
    whole = set(whole_slice_dims(view))
    return _per_dim(view, whole.__contains__)


def slice_localize(view: OpView) -> dict:
    limits = list(view.params["limit_indices"])
    for d in whole_slice_dims(view):
        limits[d] = view.in_shapes[0][d]
    return dict(view.params, limit_indices=tuple(limits))


declare("slice", Primitive(Kind.MOVEMENT, no_flops, slice_rule, localize=slice_localize,
                           linear="all", doc="t_d -> t_d for every dim d taken whole"))


# --- values made from nothing --------------------------------------------------------------


def generated_rule(view: OpView) -> ShardingRule:
    """One pass-through factor per result dim, with no operand: any dim can be tiled,
    each tile computing its own part (from its offset where the values depend on it)."""
    shape = _out_shape(view)
    b = RuleBuilder([t.rank for t in view.in_types], [len(shape)])
    for d, size in enumerate(shape):
        b.factor(size, results={0: d})
    return b.build()


def iota_apply(op: OpView, prim, operands, ctx):
    local = prim.bind(**op.params)
    # The offset is 0 (and this a no-op) when the counting dim is not tiled.
    offset = ctx.result_offset(0, op.params["dimension"])
    if isinstance(offset, int) and offset == 0:
        return [local]
    return [local + jnp.asarray(offset).astype(local.dtype)]


def constant_apply(op: OpView, prim, operands, ctx):
    value = jnp.asarray(op.params["value"])
    for d, size in enumerate(op.out_types[0].shape):
        if size != value.shape[d]:
            value = ctx.cut(value, 0, d, size)
    return [value]


declare("iota", Primitive(Kind.BROADCAST, no_flops, generated_rule,
                          localize=_result_shape("shape"), apply=iota_apply,
                          doc="() -> t_d for every d; tiles of the counting dim add their "
                              "offset"))
declare(CONSTANT, Primitive(Kind.BROADCAST, no_flops, generated_rule, apply=constant_apply,
                              doc="() -> t_d for every d; the tile is sliced at its "
                                  "offset"), jax=False)
