"""PRNG primitives: keys made, split, folded, wrapped and turned into random bits.

JAX computes these primitives by mapping the PRNG implementation over every element of a
key array, so each dimension of the keys is a pass-through factor (a batch of keys
sharded like data). The key data's trailing dims (`random_wrap`'s operand,
`random_unwrap`'s result) hold one key together and need replication.

Dimensions a primitive draws from a single key are computed from a counter over the
whole drawn shape. For `random_bits` with JAX's partitionable threefry
(`jax_threefry_partitionable`, the default), the bits at a position are threefry2x32 of
the key and the position's linear index in the drawn shape, so a tile computes exactly
its part of the global bits from its offsets, as iota does: those dims pass through.
Other implementations, `random_split`'s new keys and `random_gamma`'s draws beyond the
keys' rank need replication.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import threefry2x32_p

from partir.rules.catalogue import Kind, OpView, Primitive, declare, no_flops, per_point
from partir.rules.elementwise import elementwise_rule, leading_dims_rule
from partir.rules.factors import RuleBuilder, ShardingRule

_THREEFRY = "threefry2x32"
# threefry2x32's 20 rounds of add, rotate (2 shifts and an or) and xor, and its 5 key
# injections of 3 adds, on a pair of 32-bit words.
THREEFRY_OPS = 20 * 5 + 5 * 3
# Marsaglia-Tsang's gamma sampler: a key split, about 1.2 rounds of a normal and a uniform
# draw (3 hashes), and some 30 arithmetic ops and transcendentals per draw.
GAMMA_OPS = 4 * THREEFRY_OPS + 30


def counter_based(view: OpView) -> bool:
    """Are the drawn bits threefry of a 32-bit linear index, which a tile can offset?"""
    impl = view.in_types[0].dtype._impl
    return (impl.name == _THREEFRY and jax.config.jax_threefry_partitionable
            and math.prod(view.params["shape"]) < 2 ** 32)


def random_bits_rule(view: OpView) -> ShardingRule:
    keys, out = view.in_types[0], view.out_types[0]
    b = RuleBuilder([keys.rank], [out.rank])
    for d in range(keys.rank):
        b.factor(keys.shape[d], {0: d}, {0: d})
    drawn = counter_based(view)
    for d in range(keys.rank, out.rank):
        b.factor(out.shape[d], results={0: d}, kind="pass-through" if drawn
                 else "need-replication")
    return b.build()


def random_bits_localize(view: OpView) -> dict:
    return dict(view.params, shape=view.out_types[0].shape[view.in_types[0].rank:])


def random_bits_apply(op: OpView, prim, operands, ctx):
    """A tile of partitionable threefry bits hashes its own positions: threefry2x32 of
    the key and the position's linear index in the global drawn shape, below 2**32 so its
    high word is 0."""
    (keys,) = operands
    rank, out = keys.ndim, op.out_types[0].shape
    global_drawn = ctx.out_types[0].shape[rank:]
    if out[rank:] == global_drawn:
        return [prim.bind(keys, **op.params)]
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


# One counter-based hash per output element (random word or new key), fused with its
# consumers as XLA fuses the iota/threefry/xor it lowers to; too costly to duplicate into
# several of them.
declare("random_bits", Primitive(
    Kind.ELEMENTWISE, per_point(THREEFRY_OPS), random_bits_rule,
    localize=random_bits_localize, expensive=True, apply=random_bits_apply,
    doc="t_d -> t_d for every dim d of the key array; ⊥ -> t_d for drawn dims of "
        "partitionable threefry bits"))
declare("random_split", Primitive(
    Kind.ELEMENTWISE, per_point(THREEFRY_OPS), leading_dims_rule, expensive=True,
    doc="t_d -> t_d for every dim d of the key array; the new keys' dims whole"))
declare(("random_fold_in", "threefry2x32"), Primitive(
    Kind.ELEMENTWISE, per_point(THREEFRY_OPS), elementwise_rule, expensive=True,
    doc="t_d, ..., t_d -> t_d for every dimension d: one key (or counter) per element"))
declare("random_seed", Primitive(
    Kind.ELEMENTWISE, per_point(1), elementwise_rule,
    doc="t_d -> t_d for every dimension d: one key per element"))
declare("random_gamma", Primitive(
    Kind.KERNEL, per_point(GAMMA_OPS), leading_dims_rule,
    doc="t_d -> t_d for every dim d of the key array"))
# Key wrapping and unwrapping reinterpret the key data's buffer.
declare(("random_wrap", "random_unwrap"), Primitive(
    Kind.FREE, no_flops, leading_dims_rule,
    doc="t_d -> t_d for every dim d of the key array; the key data's dims whole"))
declare("random_clone", Primitive(
    Kind.FREE, no_flops, elementwise_rule,
    doc="t_d -> t_d for every dimension d: one key per element"))
