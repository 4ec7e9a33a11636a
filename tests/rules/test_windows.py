"""Window reductions (max and average pooling), their gradients and the generic
reduce_window, checked by the TMR oracle: unit-window dims pass through, others stay
whole."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.lax.windowed_reductions import _select_and_gather_add

from partir.core.tmr import OpView, lookup
from partir.rules import CATALOGUE
from tests.core.tmr.oracle import check_entry, check_op, random_operands, traced_ops

rng = np.random.default_rng(0)
X = rng.normal(size=(8, 8, 8, 4)).astype(np.float32)  # NHWC
XC = rng.normal(size=(4, 8, 8, 8)).astype(np.float32)  # NCHW


def avg_pool(x):
    return lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9


def max_pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def min_pool_nchw(x):
    return lax.reduce_window(x, jnp.inf, lax.min, (1, 1, 2, 2), (1, 1, 1, 1), "SAME")


def _view(op):
    return OpView.of(op)


def _mappings(op):
    return [str(m) for m in lookup(op.name).mappings(_view(op))]


@pytest.mark.parametrize("fn, x, name", [
    (avg_pool, X, "reduce_window_sum"),
    (max_pool, X, "reduce_window_max"),
    (min_pool_nchw, XC, "reduce_window_min"),
], ids=["avg", "max", "min_nchw"])
def test_pooling(fn, x, name):
    (op,) = traced_ops(fn, name, x)
    unit = [d for d in range(4) if op.params["window_dimensions"][d] == 1]
    assert _mappings(op) == [f"(#tile<{d}>) -> #tile<{d}>" for d in unit]
    assert check_op(op, x) >= 10


def test_pooling_flops_count_window_elements():
    (op,) = traced_ops(max_pool, "reduce_window_max", X)
    view = _view(op)
    prim = CATALOGUE[op.name]
    assert prim.flops(view, prim.rule(view)) == 8 * 4 * 4 * 4 * 4


def test_dilated_and_padded_dims_are_whole():
    def f(x):
        return lax.reduce_window(x, 0.0, lax.add, (1, 1, 1, 1), (1, 1, 1, 1),
                                 ((0, 0), (1, 0), (0, 0), (0, 0)), base_dilation=(1, 1, 2, 1))
    (op,) = traced_ops(f, "reduce_window_sum", X)
    assert _mappings(op) == ["(#tile<0>) -> #tile<0>", "(#tile<3>) -> #tile<3>"]
    assert check_op(op, X) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("fn, x", [(avg_pool, X), (max_pool, X), (min_pool_nchw, XC)],
                         ids=["avg", "max", "min_nchw"])
def test_pooling_gradients(fn, x):
    grad = jax.grad(lambda a: (fn(a) ** 2).sum())
    ops = [op for op in jax.make_jaxpr(grad)(x).eqns]
    names = {e.primitive.name for e in ops}
    checked = 0
    for name in sorted(names & {"reduce_window_sum", "select_and_scatter_add",
                                "reduce_window_max", "reduce_window_min"}):
        for op in traced_ops(grad, name, x):
            checked += check_op(op, *random_operands(op, rng))
    assert checked >= 10


def test_select_and_scatter_add_mappings():
    grad = jax.grad(lambda a: (max_pool(a) ** 2).sum())
    (op,) = traced_ops(grad, "select_and_scatter_add", X)
    assert _mappings(op) == ["(#tile<0>, #tile<0>) -> #tile<0>",
                             "(#tile<3>, #tile<3>) -> #tile<3>"]
    # Distinct values: the selected element of each window is unambiguous.
    x = rng.permutation(X.size).astype(np.float32).reshape(X.shape)
    assert check_op(op, rng.normal(size=(8, 4, 4, 4)).astype(np.float32), x) >= 10


def test_select_and_gather_add():
    def f(t, x):
        return _select_and_gather_add(t, x, lax.ge_p, (1, 2, 2, 1), (1, 2, 2, 1),
                                      ((0, 0), (0, 0), (0, 0), (0, 0)), (1, 1, 1, 1),
                                      (1, 1, 1, 1))
    t = rng.normal(size=X.shape).astype(np.float32)
    (op,) = traced_ops(f, "select_and_gather_add", t, X)
    assert _mappings(op) == ["(#tile<0>, #tile<0>) -> #tile<0>",
                             "(#tile<3>, #tile<3>) -> #tile<3>"]
    assert check_entry(f, t, X) >= 10


def test_max_pool_jvp_uses_select_and_gather_add():
    t = rng.normal(size=X.shape).astype(np.float32)
    jvp = lambda a, b: jax.jvp(max_pool, (a,), (b,))[1]  # noqa: E731
    ops = traced_ops(jvp, "select_and_gather_add", X, t)
    for op in ops:
        assert check_op(op, *random_operands(op, rng)) >= 10


def test_generic_reduce_window():
    def f(x, y):
        return lax.reduce_window((x, y), (0.0, -jnp.inf),
                                 lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])),
                                 (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    y = rng.normal(size=X.shape).astype(np.float32)
    (op,) = traced_ops(f, "reduce_window", X, y)
    assert _mappings(op) == ["(#tile<0>, #tile<0>, ⊥, ⊥) -> #tile<0>, #tile<0>",
                             "(#tile<3>, #tile<3>, ⊥, ⊥) -> #tile<3>, #tile<3>"]
    assert check_op(op, X, y, np.float32(0), np.float32(-np.inf)) >= 10
