"""Constants: a tile of a constant is the constant sliced at the tile's offset."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from partir.core.tmr.registry import register_apply


def constant_apply(op, prim, operands, ctx):
    value = jnp.asarray(op.params["value"])
    local = op.out_types[0].shape
    for d, size in enumerate(local):
        if size != value.shape[d]:
            value = lax.dynamic_slice_in_dim(value, ctx.result_offset(0, d), size, axis=d)
    return [value]


register_apply("constant", constant_apply)
