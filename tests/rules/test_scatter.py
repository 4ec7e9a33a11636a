"""scatter (set), scatter-mul, scatter-min, scatter-max and scatter-sub, checked by the TMR
oracle like scatter-add: batching dims, whole windows and indexed unit-window operand
dims tile; the updates' scatter dims are a #sum<min/max> (add for sub) or stay whole."""

from __future__ import annotations

import numpy as np
import pytest
from jax import lax

from partir.core.tmr import OpView, lookup
from partir.rules import CATALOGUE
from tests.core.tmr.oracle import check_entry, traced_ops
from tests.core.tmr.test_indexing import BAD_ROWS, EMBED_SCATTER, MODES, ROWS

rng = np.random.default_rng(0)
# The embedding rows and modes of the scatter-add tests: the same table, hit unevenly.
EMBED = EMBED_SCATTER
SCATTERS = {"scatter": lax.scatter, "scatter-mul": lax.scatter_mul,
            "scatter-min": lax.scatter_min, "scatter-max": lax.scatter_max,
            "scatter-sub": lax.scatter_sub}
# The updates' scatter dim: its action, or None where it stays whole.
SUMS = {"scatter": None, "scatter-mul": None, "scatter-min": "#sum<min>",
        "scatter-max": "#sum<max>", "scatter-sub": "#sum"}


def _rows(mode, n, unique=False):
    rows = (np.arange(16, dtype=np.int32) * 2 + 1) if unique else ROWS.copy()
    rows = rows[:n]
    if mode != "promise_in_bounds":
        rows[:4] = BAD_ROWS
    return rows[:, None]


def _table(name, shape, dtype=np.float32):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    # near 1 for products
    x = rng.normal(size=shape)
    return (1 + 0.1 * x if name == "scatter-mul" else x).astype(dtype)


def _mappings(fn, *args):
    (op,) = [op for op in traced_ops(fn, fn.name, *args)]
    view = OpView.of(op)
    return [str(m) for m in lookup(op.name).mappings(view)]


def _fn(name, dn, mode="promise_in_bounds", unique=False):
    def f(t, i, u):
        return SCATTERS[name](t, i, u, dn, mode=mode, unique_indices=unique)
    f.name = name
    return f


@pytest.mark.parametrize("name", SCATTERS)
def test_embedding_mappings(name):
    table, upd = _table(name, (32, 8)), _table(name, (16, 8))
    fn = _fn(name, EMBED)
    assert traced_ops(fn, name, table, _rows("clip", 16), upd)
    sum_ = [] if SUMS[name] is None else [f"(⊥, #tile<0>, #tile<0>) -> {SUMS[name]}"]
    assert _mappings(fn, table, _rows("clip", 16), upd) == [
        *sum_, "(#tile<1>, ⊥, #tile<1>) -> #tile<1>", "(#tile<0>, ⊥, ⊥) -> #tile<0>"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SCATTERS)
def test_embedding_scatter(name, mode):
    # Duplicate rows: min/max/sub/mul combine them; set keeps one (unique rows for set,
    # whose choice among duplicates XLA leaves unspecified).
    unique = name == "scatter"
    table, upd = _table(name, (32, 8)), _table(name, (16, 8))
    minimum = 11 if SUMS[name] is None else 18
    assert check_entry(_fn(name, EMBED, mode, unique), table, _rows(mode, 16, unique),
                       upd) >= minimum


@pytest.mark.slow
@pytest.mark.parametrize("name", ["scatter-min", "scatter-max"])
def test_min_max_of_integers(name):
    table, upd = _table(name, (32, 8), np.int32), _table(name, (16, 8), np.int32)
    assert check_entry(_fn(name, EMBED, "clip"), table, _rows("clip", 16), upd) >= 18


@pytest.mark.slow
@pytest.mark.parametrize("name", SCATTERS)
def test_batching_dims(name):
    # x.at[b, labels[b]] op= u[b], with batching dims as vmap makes them.
    dn = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(2,),
                                     scatter_dims_to_operand_dims=(2,),
                                     operand_batching_dims=(0, 1),
                                     scatter_indices_batching_dims=(0, 1))
    x = _table(name, (4, 8, 32))
    labels = (rng.permutation(32)[:8][None, :] + np.arange(4)[:, None]) % 32
    idx = labels.astype(np.int32)[..., None]
    upd = _table(name, (4, 8))
    fn = _fn(name, dn, "fill", unique=True)
    ms = _mappings(fn, x, idx, upd)
    assert ms[:2] == ["(#tile<0>, #tile<0>, #tile<0>) -> #tile<0>",
                      "(#tile<1>, #tile<1>, #tile<1>) -> #tile<1>"]
    assert ms[-1] == "(#tile<2>, ⊥, ⊥) -> #tile<2>"
    assert check_entry(fn, x, idx, upd) >= 18


@pytest.mark.slow
@pytest.mark.parametrize("name", SCATTERS)
def test_indexed_whole_window(name):
    x = _table(name, (16, 8))
    cols = [0, 3, -1, 0, 0, 2, 0, 0]
    idx = np.stack([np.arange(8) * 2 % 16, np.array(cols)], axis=1).astype(np.int32)
    idx[0, 0] = 19
    upd = _table(name, (8, 8))
    dn = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                     scatter_dims_to_operand_dims=(0, 1))
    fn = _fn(name, dn, "clip")
    assert "(#tile<1>, ⊥, #tile<1>) -> #tile<1>" in _mappings(fn, x, idx, upd)
    assert check_entry(fn, x, idx, upd) >= 11


def test_scatter_flops_one_per_update_element():
    table, upd = _table("scatter", (32, 8)), _table("scatter", (16, 8))
    fn = _fn("scatter-max", EMBED)
    (op,) = traced_ops(fn, "scatter-max", table, _rows("clip", 16), upd)
    view = OpView.of(op)
    prim = CATALOGUE[op.name]
    assert prim.flops(view, prim.rule(view)) == 16 * 8
