"""random_bits tiles along drawn dimensions: JAX's partitionable threefry bits at a
position are threefry2x32 of the key and the position's linear index in the global drawn
shape (see `partir.rules.random`), so a tile hashes its own positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import threefry2x32_p

from partir.core.tmr.registry import register_apply
from partir.rules import OpView


def random_bits_apply(op: OpView, prim, operands, ctx):
    (keys,) = operands
    rank, out = keys.ndim, op.out_types[0].shape
    global_drawn = ctx.out_types[0].shape[rank:]
    if out[rank:] == global_drawn:
        return [prim.bind(keys, **op.params)]
    # JAX's partitionable threefry bits: hash (key, linear index of the position in the
    # global drawn shape), the index below 2**32 so its high word is 0.
    strides = np.cumprod((1, *global_drawn[:0:-1]))[::-1]
    index = jnp.zeros(out, np.uint32)
    for j, stride in enumerate(strides):
        offset = lax.convert_element_type(ctx.result_offset(0, rank + j), np.uint32)
        positions = lax.broadcasted_iota(np.uint32, out, rank + j) + offset
        index = index + positions * np.uint32(stride)
    data = jax.random.key_data(keys)
    k1, k2 = (lax.broadcast_in_dim(data[..., w], out, tuple(range(rank))) for w in (0, 1))
    bits1, bits2 = threefry2x32_p.bind(k1, k2, jnp.zeros(out, np.uint32), index)
    width = op.params["bit_width"]
    dtype = np.dtype(f"uint{width}")
    if width == 64:
        hi = lax.convert_element_type(bits1, dtype)
        return [lax.shift_left(hi, dtype.type(32)) | lax.convert_element_type(bits2, dtype)]
    return [lax.convert_element_type(bits1 ^ bits2, dtype)]


register_apply("random_bits", random_bits_apply)
