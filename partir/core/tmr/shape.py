"""iota: a tile along the counting dimension starts at its offset in the global iota."""

from __future__ import annotations

import jax.numpy as jnp

from partir.core.tmr.registry import register_apply


def iota_apply(op, prim, operands, ctx):
    local = prim.bind(**op.params)
    # The offset is 0 (and this a no-op) when the counting dim is not tiled.
    offset = ctx.result_offset(0, op.params["dimension"])
    if isinstance(offset, int) and offset == 0:
        return [local]
    return [local + jnp.asarray(offset).astype(local.dtype)]


register_apply("iota", iota_apply)
