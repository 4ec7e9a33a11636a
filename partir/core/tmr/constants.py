"""Constants: a tile of a constant is the constant sliced at the tile's offset."""

from __future__ import annotations

import jax.numpy as jnp

from partir.core.tmr.registry import register_apply
from partir.ir.opnames import CONSTANT


def constant_apply(op, prim, operands, ctx):
    value = jnp.asarray(op.params["value"])
    for d, size in enumerate(op.out_types[0].shape):
        if size != value.shape[d]:
            value = ctx.cut(value, 0, d, size)
    return [value]


register_apply(CONSTANT, constant_apply)
