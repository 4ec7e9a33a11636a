"""Shape ops whose tiles depend on where they lie: a tile of iota along the counting
dimension starts at its offset; a tile of a concatenate along the concatenated dimension
is cut out of the whole operands at its offset."""

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


def concatenate_apply(op, prim, operands, ctx):
    # The operands are whole along the dimension (`Factor.whole`), the other dims sliced
    # alike; concatenated, they are the whole result there.
    d = op.params["dimension"]
    whole = prim.bind(*operands, **op.params)
    size = op.out_types[0].shape[d]
    if whole.shape[d] == size:
        return [whole]
    return [ctx.cut(whole, 0, d, size)]


register_apply("concatenate", concatenate_apply)
