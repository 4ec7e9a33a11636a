"""Constants: any dimension can be tiled; each tile slices the constant at its offset."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from partir.core.actions import Tile
from partir.core.tmr.registry import Entry, OpView, TileMapping, register


def constant_mappings(op: OpView):
    for d in range(op.out_types[0].rank):
        yield TileMapping((), (Tile(d),))


def constant_apply(op: OpView, prim, operands, ctx):
    value = jnp.asarray(op.params["value"])
    local = op.out_types[0].shape
    for d, size in enumerate(local):
        if size != value.shape[d]:
            value = lax.dynamic_slice_in_dim(value, ctx.result_offset(0, d), size, axis=d)
    return [value]


register("constant", Entry(constant_mappings, apply=constant_apply,
                           doc="() -> t_d for every d; the tile is sliced at its offset"))
