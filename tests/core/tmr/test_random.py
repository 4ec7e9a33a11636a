"""TMR entries of the PRNG primitives, checked bit for bit against JAX: dims of a key
array tile; dims drawn from one key only where a tile can compute its own bits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p

from partir.core.tmr import OpView, lookup
from partir.frontend import trace
from partir.ir.opnames import CONSTANT
from tests.core.tmr.oracle import check_entry


def _keys(n):
    return jax.random.split(jax.random.key(0), n)


def _op(fn, *args):
    (op,) = [op for op in trace(fn, *args).function.ops if op.name != CONSTANT]
    return op


def _mappings(op):
    view = OpView.of(op)
    return list(lookup(op.name).mappings(view))


# 10 s to a minute per width (uint64 with x64 on): in CI, not in the fast loop.
@pytest.mark.slow
@pytest.mark.parametrize("width", [jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64])
def test_threefry_bits_of_one_key_tile_the_drawn_dims_at_their_offsets(width):
    with jax.enable_x64(width == jnp.uint64):
        bits = lambda k: jax.random.bits(k, (8, 4, 2), width)  # noqa: E731
        assert check_entry(bits, jax.random.key(1)) >= 3 + 3 * 3
        batched = jax.vmap(bits)
        assert len(_mappings(_op(batched, _keys(4)))) == 4
        assert check_entry(batched, _keys(4)) >= 4


def test_bits_drawn_by_other_implementations_offer_no_tile():
    key = jax.random.key(1, impl="rbg")
    assert _mappings(_op(lambda k: jax.random.bits(k, (8, 4)), key)) == []
    with jax.threefry_partitionable(False):
        op = _op(lambda k: jax.random.bits(k, (8, 4)), jax.random.key(1))
        assert _mappings(op) == []


@pytest.mark.slow
def test_random_split_tiles_its_keys_not_the_new_dims():
    split = jax.vmap(lambda k: jax.random.split(k, 2))
    assert check_entry(split, _keys(8)) >= 2
    assert len(_mappings(_op(split, _keys(8)))) == 1


@pytest.mark.slow
def test_random_fold_in_per_key_and_broadcast_message():
    assert check_entry(lambda k, m: jax.vmap(jax.random.fold_in)(k, m), _keys(8),
                       jnp.arange(8, dtype=jnp.uint32)) >= 2
    assert check_entry(lambda k: jax.vmap(lambda kk: jax.random.fold_in(kk, 7))(k),
                       _keys(8)) >= 2


def test_wrap_and_unwrap_keep_the_key_data_whole():
    data = np.asarray(jax.random.key_data(_keys(8)))
    assert check_entry(jax.random.wrap_key_data, data) >= 2
    assert check_entry(jax.random.key_data, _keys(8)) >= 2
    for fn, arg in ((jax.random.wrap_key_data, data), (jax.random.key_data, _keys(8))):
        assert [m.operands for m in _mappings(_op(fn, arg))] == [(0,)]


def test_random_seed_per_seed():
    assert check_entry(jax.vmap(jax.random.key), jnp.arange(8, dtype=jnp.int32)) >= 2


@pytest.mark.slow
def test_random_gamma_tiles_the_key_dims_only():
    gamma = jax.vmap(lambda k, a: jax.random.gamma(k, a))
    a = jnp.linspace(0.5, 3.0, 24, dtype=jnp.float32).reshape(8, 3)
    assert check_entry(gamma, _keys(8), a) >= 2
    assert len(_mappings(_op(gamma, _keys(8), a))) == 1


@pytest.mark.slow
def test_threefry2x32_is_elementwise():
    x = jnp.arange(32, dtype=jnp.uint32).reshape(8, 4)
    assert check_entry(lambda a, b, c, d: threefry2x32_p.bind(a, b, c, d),
                       x, x + 1, x * 3, x ^ 5) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("src,dst", [(jnp.float32, jnp.uint8), (jnp.uint8, jnp.float32),
                                     (jnp.uint32, jnp.float32)])
def test_bitcast_convert_type_keeps_the_width_dim_whole(src, dst):
    x = jnp.arange(8 * 4 * 4).astype(src).reshape(8, 4, 4)
    assert check_entry(lambda a: jax.lax.bitcast_convert_type(a, dst), x) >= 4
