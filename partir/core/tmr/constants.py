"""Constants: a tile of a constant is the constant sliced at the tile's offset."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from partir.core.tmr.registry import register_apply
from partir.ir.opnames import CONSTANT


def constant_apply(op, prim, operands, ctx):
    value = jnp.asarray(op.params["value"])
    local = op.out_types[0].shape
    for d, size in enumerate(local):
        if size != value.shape[d]:
            # A padded dimension's last tiles reach past its end: pad it first, or the
            # slice would be clamped back into the constant.
            padded = size * ctx.result_tiles(0, d)
            if padded > value.shape[d]:
                widths = [(0, 0)] * value.ndim
                widths[d] = (0, padded - value.shape[d])
                value = jnp.pad(value, widths)
            value = lax.dynamic_slice_in_dim(value, ctx.result_offset(0, d), size, axis=d)
    return [value]


register_apply(CONSTANT, constant_apply)
