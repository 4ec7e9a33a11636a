"""The declarations of scan, while and cond: how often their regions run, and their FLOPs."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from partir.frontend import trace
from partir.rules import CATALOGUE, OpView
from partir.rules.catalogue import flops_of, region_ops


def _view(fn, *args) -> OpView:
    """The view of the (only) control-flow op of fn's traced program, with its regions."""
    (op,) = [o for o in trace(fn, *args).function.ops if o.name in ("scan", "while", "cond")]
    return OpView.of(op)


def _factors(view: OpView) -> list[tuple[str, int, tuple, tuple, tuple]]:
    rule = CATALOGUE[view.name].rule(view)
    return [(f.kind, f.size, rule.operand_dims[i], rule.result_dims[i], f.unrelated)
            for i, f in enumerate(rule.factors)]


X = jnp.ones((8, 4))
WS = jnp.ones((3, 4, 4))


def test_regions_run_as_often_as_the_data_flow_declares():
    """A scan's body runs `length` times, a while loop's an unknown number of times, one
    of a cond's branches: the ops inside and the FLOPs follow the declared trips."""
    def f(x, ws):
        def layer(c, w):
            c = lax.while_loop(lambda c: jnp.sum(c) > 1e9, lambda c: c * 2.0, c)
            return lax.cond(jnp.sum(c) > 0, lambda c: c @ w @ w, lambda c: c @ w, c), None
        return lax.scan(layer, x, ws)[0]

    (scan,) = [o for o in trace(f, X, WS).function.ops if o.name == "scan"]
    times = {inner.name: t for inner, t in region_ops(scan)}
    assert times["while"] == times["cond"] == 3
    assert times["mul"] is None  # inside the while loop
    assert times["dot_general"] == 3  # inside a branch: as if it were taken
    view = OpView.of(scan)
    # per layer: the costlier branch's two [8,4]x[4,4] matmuls, the loop body's once
    matmul = 2 * 8 * 4 * 4
    assert flops_of(CATALOGUE["scan"], view) >= 3 * 2 * matmul
    assert flops_of(CATALOGUE["scan"], view) < 3 * 3 * matmul
