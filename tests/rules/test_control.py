"""The factor rules of scan, while and cond, derived from their bodies."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jax import lax

from partir.frontend import trace
from partir.ir import Op, Value
from partir.ir.evaluate import evaluate
from partir.ir.types import TensorType
from partir.rules import CATALOGUE, OpView
from partir.rules.catalogue import Slicing, flops_of, region_ops
from partir.rules.collectives import ALL_REDUCE
from partir.rules.factors import PASS, REDUCTION, REPLICATION


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


def test_a_scan_over_layers_passes_the_batch_through_and_sums_per_step_reductions():
    def f(x, ws):
        return lax.scan(lambda c, w: (jnp.tanh(c @ w), jnp.sum(c)), x, ws)

    found = _factors(_view(f, X, WS))
    # the batch: carry in and out tiled, the per-step sums are partial sums over it
    assert (REDUCTION, 8, (0, None), (0, None), ()) in found
    # the features are contracted by the matmul in the body: replicated
    assert (REPLICATION, 4, (1, None), (None, None), ()) in found
    # the scanned dimension of the weights and of the stacked results
    assert (REPLICATION, 3, (None, 0), (None, None), ()) in found
    assert (REPLICATION, 3, (None, None), (None, 0), ()) in found


def test_a_step_counter_does_not_depend_on_the_batch():
    def f(x):
        return lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.sin(s[1])), (0, x))

    found = _factors(_view(f, X))
    assert (PASS, 8, (None, 0), (None, 0), (0,)) in found


def test_a_predicate_summing_the_data_sums_it_over_the_slices():
    # each slice's sum is partial: summed over the slices before the comparison, every
    # slice takes the same decision
    def f(x):
        return lax.while_loop(lambda c: jnp.sum(c) < 10.0, lambda c: c * 2.0, x)

    assert (PASS, 8, (0,), (0,), ()) in _factors(_view(f, X))


def test_a_predicate_reading_the_data_otherwise_replicates_it():
    def f(x):
        return lax.while_loop(lambda c: c[0, 0] < 10.0, lambda c: c * 2.0, x)

    assert all(kind == REPLICATION for kind, *_ in _factors(_view(f, X)))


def _sums(region) -> list[tuple[str, ...]]:
    return [op.params["axes"] for op in region.ops if op.name == ALL_REDUCE]


def test_partial_sums_used_whole_in_a_body_are_summed_over_the_axes_slicing_them():
    """Megatron through a scan over layers: the hidden dimension is sliced, the second
    matmul's partial sums are summed over its axis before the residual add."""
    def f(x, w1, w2):
        return lax.scan(lambda c, w: (c + jnp.tanh(c @ w[0]) @ w[1], None), x, (w1, w2))

    view = _view(f, X, jnp.ones((3, 4, 6)), jnp.ones((3, 6, 4)))
    assert (PASS, 6, (None, 2, 1), (None,), (0,)) in _factors(view)
    hidden = (view.in_types[0], TensorType((3, 4, 3), X.dtype), TensorType((3, 3, 4), X.dtype))
    local = OpView(view.name, view.params, hidden, view.out_types,
                   Slicing(((), ((), (), ("model",)), ((), ("model",), ())), {"model": 2}),
                   view.regions)
    (body,) = CATALOGUE["scan"].localize(local).regions
    assert _sums(body) == [("model",)]
    # unsliced, the body is left as it is
    assert CATALOGUE["scan"].localize(view).regions == view.regions
    # sliced without saying by which axes, it cannot place the sum
    with pytest.raises(ValueError, match="does not say which axes"):
        CATALOGUE["scan"].localize(OpView(view.name, view.params, hidden, view.out_types,
                                          regions=view.regions))


def test_a_carry_that_ends_as_a_partial_sum_is_summed_before_the_next_iteration():
    def f(s, ws):
        return lax.scan(lambda c, w: (jnp.sum(w * c), None), s, ws)

    view = _view(f, jnp.float32(1.0), jnp.ones((3, 6)))
    # the carry does not start from zero: it is summed, and then the same on every slice
    assert (PASS, 6, (None, 1), (None,), (0,)) in _factors(view)
    local = OpView(view.name, view.params, (view.in_types[0], TensorType((3, 3), X.dtype)),
                   view.out_types, Slicing(((), ((), ("model",))), {"model": 2}), view.regions)
    (body,) = CATALOGUE["scan"].localize(local).regions
    assert _sums(body) == [("model",)]
    assert body.ops[-1].name == ALL_REDUCE and body.yields == [body.ops[-1].results[0]]


def test_cond_branches_are_joined():
    def f(x, y):
        return lax.cond(jnp.sum(y) > 0, lambda a: a @ jnp.ones((4, 4)), lambda a: a * 2.0, x)

    found = _factors(_view(f, X, X))
    assert (PASS, 8, (None, 0), (0,), ()) in found
    # dim 1 is contracted in one branch, passed through in the other
    assert (REPLICATION, 4, (None, 1), (None,), ()) in found


def test_regions_are_localized_to_local_shapes():
    def f(x, ws):
        return lax.scan(lambda c, w: (jnp.tanh(c @ w), jnp.sum(c)), x, ws)

    view = _view(f, X, WS)
    local = OpView(view.name, view.params, (TensorType((2, 4), X.dtype), view.in_types[1]),
                   (TensorType((2, 4), X.dtype), view.out_types[1]), regions=view.regions)
    made = CATALOGUE["scan"].localize(local)
    (body,) = made.regions
    assert [a.type.shape for a in body.args] == [(2, 4), (4, 4)]
    op = Op("scan", [Value(t) for t in local.in_types], [Value(t) for t in local.out_types],
            made.params, list(made.regions))
    out = evaluate(op, [jnp.ones((2, 4)), WS])
    assert out[0].shape == (2, 4) and out[1].shape == (3,)


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
