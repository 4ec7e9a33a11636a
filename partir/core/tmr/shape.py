"""Shape primitives: ops that move, select or replicate elements without combining them.

A dimension is offered only where the op maps a contiguous chunk of the operand onto a
contiguous chunk of the result for every chunk count; dimensions whose elements are
reordered, offset or strided (a reversed, padded or sliced dimension, the concatenation
axis) block propagation instead.
"""

from __future__ import annotations

import jax.numpy as jnp

from partir.core.actions import Tile
from partir.core.tmr.registry import Entry, OpView, TileMapping, register


def _out_shape(op: OpView) -> tuple[int, ...]:
    return tuple(op.out_types[0].shape)


def broadcast_in_dim_mappings(op: OpView):
    # Extra operands are dynamic shapes, whose tiling we do not describe.
    if len(op.in_types) != 1:
        return
    in_shape, out_shape = op.in_shapes[0], _out_shape(op)
    source = {d: i for i, d in enumerate(op.params["broadcast_dimensions"])}
    for d in range(len(out_shape)):
        i = source.get(d)
        # A broadcast size-1 dim holds one value for the whole result dim: every tile
        # of the result reads all of it.
        sliced = i if i is not None and in_shape[i] == out_shape[d] else None
        yield TileMapping((sliced,), (Tile(d),))


def broadcast_in_dim_localize(op: OpView):
    return dict(op.params, shape=_out_shape(op))


register("broadcast_in_dim", Entry(
    broadcast_in_dim_mappings, localize=broadcast_in_dim_localize,
    doc="t_i -> t_d for operand dim i broadcast to result dim d of the same size; "
        "⊥ -> t_d for new and size-1-broadcast result dims"))


def _major_dims(in_shape, out_shape):
    """Pairs (i, o) of the first non-1 dims of each group of a reshape.

    A group is a minimal run of dims on each side with equal products; row-major order
    makes a chunk of a group's major dim a contiguous range of the group's elements, so
    chunking the major dims of both sides selects the same elements.
    """
    ins = [(d, s) for d, s in enumerate(in_shape) if s != 1]
    outs = [(d, s) for d, s in enumerate(out_shape) if s != 1]
    pairs = []
    a = b = 0
    while a < len(ins) and b < len(outs):
        pairs.append((ins[a][0], outs[b][0]))
        pin, pout = ins[a][1], outs[b][1]
        a, b = a + 1, b + 1
        while pin != pout:
            if pin < pout:
                pin *= ins[a][1]
                a += 1
            else:
                pout *= outs[b][1]
                b += 1
    return pairs


def reshape_mappings(op: OpView):
    in_shape, out_shape = op.in_shapes[0], _out_shape(op)
    # `dimensions` transposes the operand first; zero-size shapes have no groups.
    if op.params.get("dimensions") is not None or len(op.in_types) != 1 or 0 in in_shape:
        return
    for i, o in _major_dims(in_shape, out_shape):
        yield TileMapping((i,), (Tile(o),))


def reshape_localize(op: OpView):
    return dict(op.params, new_sizes=_out_shape(op))


register("reshape", Entry(
    reshape_mappings, localize=reshape_localize,
    doc="t_i -> t_o where i and o are the major dims of a group of merged/split dims"))


def transpose_mappings(op: OpView):
    for d, i in enumerate(op.params["permutation"]):
        yield TileMapping((i,), (Tile(d),))


register("transpose", Entry(transpose_mappings, doc="t_perm[d] -> t_d"))


def squeeze_mappings(op: OpView):
    removed = set(op.params["dimensions"])
    kept = [i for i in range(op.in_types[0].rank) if i not in removed]
    for d, i in enumerate(kept):
        yield TileMapping((i,), (Tile(d),))


register("squeeze", Entry(squeeze_mappings, doc="t_i -> t_d for every kept operand dim i"))


def rev_mappings(op: OpView):
    reversed_dims = set(op.params["dimensions"])
    for d in range(op.in_types[0].rank):
        if d not in reversed_dims:
            yield TileMapping((d,), (Tile(d),))


register("rev", Entry(rev_mappings, doc="t_d -> t_d for every dim d that is not reversed"))


def concatenate_mappings(op: OpView):
    for d in range(op.out_types[0].rank):
        if d != op.params["dimension"]:
            yield TileMapping(tuple(d for _ in op.in_types), (Tile(d),))


register("concatenate", Entry(concatenate_mappings,
                              doc="t_d, ..., t_d -> t_d for every d but the concatenated one"))


def pad_mappings(op: OpView):
    for d, config in enumerate(op.params["padding_config"]):
        if tuple(config) == (0, 0, 0):
            yield TileMapping((d, None), (Tile(d),))


register("pad", Entry(pad_mappings, doc="t_d, ⊥ -> t_d for every unpadded dim d"))


def _whole_slice_dims(op: OpView):
    """Dims the slice takes whole: start 0, stride 1 and as large as the operand.

    Sizes rather than `limit_indices` are compared since the params may be the global
    ones while the types are local.
    """
    strides = op.params["strides"] or (1,) * op.in_types[0].rank
    return [d for d, (start, stride, n, m) in enumerate(zip(
        op.params["start_indices"], strides, op.in_shapes[0], _out_shape(op), strict=True))
        if start == 0 and stride == 1 and n == m]


def slice_mappings(op: OpView):
    for d in _whole_slice_dims(op):
        yield TileMapping((d,), (Tile(d),))


def slice_localize(op: OpView):
    limits = list(op.params["limit_indices"])
    for d in _whole_slice_dims(op):
        limits[d] = op.in_shapes[0][d]
    return dict(op.params, limit_indices=tuple(limits))


register("slice", Entry(slice_mappings, localize=slice_localize,
                        doc="t_d -> t_d for every dim d taken whole"))


def iota_mappings(op: OpView):
    for d in range(op.out_types[0].rank):
        yield TileMapping((), (Tile(d),))


def iota_localize(op: OpView):
    return dict(op.params, shape=_out_shape(op))


def iota_apply(op: OpView, prim, operands, ctx):
    local = prim.bind(**op.params)
    # Tiles along the counting dim start at their offset in the global iota; the offset
    # is 0 (and this a no-op) when that dim is not tiled.
    offset = ctx.result_offset(0, op.params["dimension"])
    if isinstance(offset, int) and offset == 0:
        return [local]
    return [local + jnp.asarray(offset).astype(local.dtype)]


register("iota", Entry(iota_mappings, localize=iota_localize, apply=iota_apply,
                       doc="() -> t_d for every d; tiles of the counting dim add their "
                           "offset"))


def split_mappings(op: OpView):
    for d in range(op.in_types[0].rank):
        if d != op.params["axis"]:
            yield TileMapping((d,), tuple(Tile(d) for _ in op.out_types))


register("split", Entry(split_mappings,
                        doc="t_d -> t_d, ..., t_d for every d but the split axis"))
