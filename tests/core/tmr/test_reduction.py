import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from partir.core.actions import Sum, Tile
from partir.core.tmr import OpView, TileMapping, lookup
from partir.ir import TensorType
from tests.core.tmr.oracle import check_entry

rng = np.random.default_rng(0)
X = rng.normal(size=(4, 8, 8)).astype(np.float32)
I = rng.integers(0, 256, size=(4, 8, 8)).astype(np.int32)
B = rng.random(size=(4, 8, 8)) > 0.2
# Near 1 so that products neither overflow nor vanish.
P = (1.0 + 0.1 * X).astype(np.float32)


def _mappings(name, params, in_shapes, out_shapes, dtype=np.float32, out_dtype=None):
    view = OpView(name, params, tuple(TensorType(s, np.dtype(dtype)) for s in in_shapes),
                  tuple(TensorType(s, np.dtype(out_dtype or dtype)) for s in out_shapes))
    return list(lookup(name).mappings(view))


@pytest.mark.slow
@pytest.mark.parametrize("fn, x, minimum", [
    (lambda a: jnp.sum(a, axis=1), X, 23),
    (lambda a: jnp.sum(a, axis=(0, 2)), X, 23),
    (lambda a: jnp.max(a, axis=0), X, 23),
    (lambda a: jnp.min(a, axis=2), I, 23),
    (lambda a: jnp.all(a, axis=1), B, 23),
    (lambda a: jnp.any(a, axis=(1, 2)), B, 23),
], ids=["sum", "sum_two_axes", "max", "min_int", "and_bool", "or_bool"])
def test_reductions_with_monoid(fn, x, minimum):
    assert check_entry(fn, x) >= minimum


@pytest.mark.slow
@pytest.mark.parametrize("fn, x, minimum", [
    (lambda a: jnp.prod(a, axis=1), P, 11),
    (lambda a: lax.reduce_xor_p.bind(a, axes=(1,)), I, 11),
    (lambda a: lax.reduce_and_p.bind(a, axes=(0,)), I, 11),
    (lambda a: lax.reduce_or_p.bind(a, axes=(2,)), I, 11),
], ids=["prod", "xor_int", "and_int", "or_int"])
def test_reductions_without_monoid_tile_kept_dims(fn, x, minimum):
    assert check_entry(fn, x) >= minimum


def test_reduce_max_over_sliced_dim_is_a_max_sum():
    ms = _mappings("reduce_max", {"axes": (1,)}, [(4, 8)], [(4,)])
    assert ms == [TileMapping((0,), (Tile(0),)), TileMapping((1,), (Sum("max"),))]


@pytest.mark.parametrize("name", ["reduce_prod", "reduce_xor", "reduce_and", "reduce_or"])
def test_no_sum_without_a_matching_monoid(name):
    ms = _mappings(name, {"axes": (1,)}, [(4, 8)], [(4,)], dtype=np.int32)
    assert ms == [TileMapping((0,), (Tile(0),))]


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argreduce_offers_nothing_on_its_reduced_dim(name):
    ms = _mappings(name, {"axes": (1,), "index_dtype": np.int32}, [(4, 8, 6)], [(4, 6)],
                   out_dtype=np.int32)
    assert ms == [TileMapping((0,), (Tile(0),)), TileMapping((2,), (Tile(1),))]


@pytest.mark.slow
@pytest.mark.parametrize("fn", [lambda a: jnp.argmax(a, axis=1),
                                lambda a: jnp.argmin(a, axis=0)], ids=["argmax", "argmin"])
def test_argreductions(fn):
    assert check_entry(fn, X) >= 11


@pytest.mark.slow
@pytest.mark.parametrize("fn, x", [
    (lambda a: lax.cumsum(a, axis=1), X),
    (lambda a: lax.cumprod(a, axis=2, reverse=True), P),
    (lambda a: lax.cummax(a, axis=0), I),
    (lambda a: lax.cummin(a, axis=1, reverse=True), X),
    (lambda a: lax.cumlogsumexp(a, axis=2), X),
], ids=["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"])
def test_cumulative(fn, x):
    assert check_entry(fn, x) >= 11


def test_cumulative_offers_nothing_on_its_axis():
    ms = _mappings("cumsum", {"axis": 0, "reverse": False}, [(4, 8)], [(4, 8)])
    assert ms == [TileMapping((1,), (Tile(1),))]


def test_sort_single_operand():
    assert check_entry(lambda a: lax.sort(a, dimension=1), X) >= 11


def test_sort_multiple_operands_with_ties():
    keys = rng.integers(0, 3, size=(4, 8, 8)).astype(np.int32)
    assert check_entry(lambda k, v: lax.sort((k, k, v), dimension=2, num_keys=2),
                       keys, X) >= 11


@pytest.mark.slow
@pytest.mark.parametrize("axis", [0, 2])
def test_top_k(axis):
    assert check_entry(lambda a: lax.top_k(a, 3, axis=axis), X) >= 11


def test_top_k_offers_nothing_on_its_axis():
    ms = _mappings("top_k", {"k": 3, "axis": 1}, [(4, 8)], [(4, 3), (4, 3)])
    assert ms == [TileMapping((0,), (Tile(0), Tile(0)))]
