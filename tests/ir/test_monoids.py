from __future__ import annotations

import jax.extend.core.primitives as jex_primitives
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from partir.core.actions import MONOIDS as ACTION_MONOIDS
from partir.core.actions import Sum
from partir.ir.monoids import BY_ELEMENTWISE, BY_REDUCE, MONOIDS, NAMES, of_reduce

_NUMERIC = [np.float32, np.float16, jnp.bfloat16, ml_dtypes.float8_e4m3fn, np.int32,
            np.int8, np.uint8, np.uint32]
_EXPECTED = {"add": np.add, "max": np.maximum, "min": np.minimum,
             "and": np.logical_and, "or": np.logical_or}


def _dtypes(name: str) -> list:
    return [np.bool_] if MONOIDS[name].logical else [*_NUMERIC, np.bool_]


def _random(rng: np.random.Generator, dtype, shape=(3, 5)) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if jnp.issubdtype(dt, jnp.integer):
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -50), min(info.max, 50), shape).astype(dt)
    return rng.normal(0, 4, shape).astype(dt)


def _cases():
    return [(name, dtype) for name in NAMES for dtype in _dtypes(name)]


def _all_primitive_names() -> set[str]:
    objects = [getattr(mod, n) for mod in (jex_primitives, lax) for n in dir(mod)
               if n.endswith("_p")]
    return {p.name for p in objects if hasattr(p, "bind")}


def test_names_are_the_paper_order_and_the_actions_read_them():
    assert NAMES == ("add", "max", "min", "and", "or")
    assert ACTION_MONOIDS == NAMES
    with pytest.raises(ValueError, match=r"#sum monoid must be one of \('add', 'max', "
                                         r"'min', 'and', 'or'\), got 'prod'"):
        Sum("prod")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dtype"), _cases(), ids=lambda x: getattr(x, "__name__", x))
def test_combine_agrees_with_numpy(name, dtype):
    rng = np.random.default_rng(0)
    a, b = _random(rng, dtype), _random(rng, dtype)
    got = np.asarray(MONOIDS[name].combine(jnp.asarray(a), jnp.asarray(b)))
    want = _EXPECTED[name](a, b)
    if want.dtype != np.bool_:
        want = want.astype(dtype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dtype"), _cases(), ids=lambda x: getattr(x, "__name__", x))
def test_identity_is_neutral(name, dtype):
    m = MONOIDS[name]
    e = m.identity(dtype)
    assert e.shape == () and e.dtype == np.dtype(dtype)
    x = _random(np.random.default_rng(1), dtype)
    x_, e_ = jnp.asarray(x), jnp.asarray(e)
    for got in (m.combine(x_, e_), m.combine(e_, x_)):
        np.testing.assert_array_equal(np.asarray(got), x)


def test_identity_values():
    assert MONOIDS["add"].identity(np.float32) == 0
    assert MONOIDS["max"].identity(np.float32) == -np.inf
    assert MONOIDS["min"].identity(jnp.bfloat16) == np.inf
    assert MONOIDS["max"].identity(np.int8) == -128
    assert MONOIDS["min"].identity(np.uint8) == 255
    # float8_e4m3fn has no infinities: its finite extremes are neutral
    assert float(MONOIDS["max"].identity(ml_dtypes.float8_e4m3fn)) == -448
    assert MONOIDS["and"].identity(np.bool_) and not MONOIDS["or"].identity(np.bool_)
    assert MONOIDS["max"].identity(np.bool_) == np.False_
    assert MONOIDS["min"].identity(np.bool_) == np.True_


def test_identity_is_refused_where_there_is_none():
    with pytest.raises(ValueError, match="logical"):
        MONOIDS["and"].identity(np.int32)
    with pytest.raises(ValueError, match="no identity for complex64"):
        MONOIDS["max"].identity(np.complex64)
    assert MONOIDS["add"].identity(np.complex64) == 0


def test_primitive_names_are_jax_primitives():
    known = _all_primitive_names()
    for m in MONOIDS.values():
        assert m.reduce in known, m.reduce
        for prim in m.elementwise:
            assert prim in known, prim


def test_name_maps():
    assert {p: m.name for p, m in BY_ELEMENTWISE.items()} == {
        "add": "add", "add_any": "add", "max": "max", "min": "min", "and": "and", "or": "or"}
    assert list(BY_ELEMENTWISE) == ["add", "add_any", "max", "min", "and", "or"]
    assert {p: m.name for p, m in BY_REDUCE.items()} == {
        "reduce_sum": "add", "reduce_max": "max", "reduce_min": "min",
        "reduce_and": "and", "reduce_or": "or"}
    # on integers reduce_and/reduce_or are bitwise: no logical monoid computes them
    assert of_reduce("reduce_and", np.int32) is None
    assert of_reduce("reduce_or", np.bool_) is MONOIDS["or"]
    assert of_reduce("reduce_max", np.int32) is MONOIDS["max"]
    assert of_reduce("reduce_prod", np.float32) is None


def test_collectives_are_the_jax_ones():
    # max and min wrap pmax/pmin to carry NaN (tests/runtime/test_collectives.py)
    assert [MONOIDS[n].collective for n in ("add", "and", "or")] == [lax.psum, lax.pmin,
                                                                     lax.pmax]
    assert [m.name for m in MONOIDS.values() if m.logical] == ["and", "or"]
