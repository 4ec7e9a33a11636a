"""PRNG primitives: keys made, split, folded, wrapped and turned into random bits.

JAX computes these primitives by mapping the PRNG implementation over every element of
a key array, so each dimension of the keys is an independent instance and tiles like an
elementwise dimension (a batch of keys sharded like data). The key data's trailing dims
(`random_wrap`'s operand, `random_unwrap`'s result) hold one key together and are never
sliced.

Dimensions a primitive draws from a single key are computed from a counter over the
whole drawn shape, so a tile of them is not the same primitive on a smaller shape. For
`random_bits` with JAX's partitionable threefry (`jax_threefry_partitionable`, the
default), the bits at a position are threefry2x32 of the key and the position's linear
index in the drawn shape: a tile computes exactly its part of the global bits from its
offsets, as iota does. Other implementations, `random_split`'s new keys and
`random_gamma`'s draws beyond the keys' rank are not offered: such a result stays whole.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import threefry2x32_p

from partir.core.actions import Tile
from partir.core.tmr.elementwise import elementwise_mappings, leading_dims_mappings
from partir.core.tmr.registry import Entry, OpView, TileMapping, register

_THREEFRY = "threefry2x32"


def _counter_based(op: OpView) -> bool:
    """Are the drawn bits threefry of a 32-bit linear index, which a tile can offset?"""
    impl = op.in_types[0].dtype._impl
    return (impl.name == _THREEFRY and jax.config.jax_threefry_partitionable
            and math.prod(op.params["shape"]) < 2 ** 32)


def random_bits_mappings(op: OpView):
    yield from leading_dims_mappings(op)
    if _counter_based(op):
        keys_rank = op.in_types[0].rank
        for d in range(keys_rank, op.out_types[0].rank):
            yield TileMapping((None,), (Tile(d),))


def random_bits_localize(op: OpView):
    return dict(op.params, shape=op.out_types[0].shape[op.in_types[0].rank:])


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


register("random_bits", Entry(random_bits_mappings, localize=random_bits_localize,
                              apply=random_bits_apply,
                              doc="t_d -> t_d for every dim d of the key array; ⊥ -> t_d "
                                  "for drawn dims of partitionable threefry bits"))
# The keys (or key data) are the first operand and lead every other operand and result.
register(("random_split", "random_wrap", "random_unwrap", "random_gamma"),
         Entry(leading_dims_mappings, doc="t_d -> t_d for every dim d of the key array; "
                                          "dims added from one key (splits, key data) "
                                          "whole"))
register(("random_seed", "random_fold_in", "random_clone", "threefry2x32"),
         Entry(elementwise_mappings, doc="t_d, ..., t_d -> t_d for every dimension d: "
                                         "one key (or counter) per element"))
