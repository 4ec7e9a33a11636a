"""JAX's `tile` (jnp.tile), `stack` (jnp.stack) and `unstack` primitives: their factor
rules, and programs using them partitioned on both oracles (the Core interpreter of the
partitioned program and the executed SPMD program), equal to JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import partir
from partir.core.tmr import factor_mappings
from partir.ir import TensorType
from partir.rules import CATALOGUE, REPLICATION, OpView

F32 = np.dtype(np.float32)
rng = np.random.default_rng(0)


def _view(name, params, in_shapes, out_shapes):
    return OpView(name, params, tuple(TensorType(s, F32) for s in in_shapes),
                  tuple(TensorType(s, F32) for s in out_shapes))


def _normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _check(fn, mesh, schedule, *args):
    """Both oracles equal JAX; the metadata."""
    expected = jax.jit(fn)(*args)
    core = partir.core_partition(fn, mesh, schedule, *args).interpret(*args)
    jitted, meta = partir.jit(fn, mesh, schedule)
    for what, got in (("Core interpreter", core), ("executed", jitted(*args))):
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-5,
                                       err_msg=what)
    return meta


def _gathers(meta) -> int:
    """Collectives that gather; 0 also means propagation met no conflict (an op with no
    rule is reported, and its operands gathered)."""
    if any(t.conflicts for t in meta.tactics):
        return -1
    return meta.collectives.get("all_gather", 0) + meta.collectives.get("all_to_all", 0)


# --- tile ---------------------------------------------------------------------------------


def test_tile_rule_makes_compound_result_dims():
    view = _view("tile", {"reps": (2, 1, 3)}, [(4, 5, 1)], [(8, 5, 3)])
    rule = CATALOGUE["tile"].rule(view)
    # dim 0 is (repeats 2, size 4); dim 1 passes through; dim 2 repeats a size-1 dim.
    assert rule.sizes == (2, 4, 5, 3)
    assert rule.operands == (((1,), (2,), ()),)
    assert rule.results == (((0, 1), (2,), (3,)),)
    # The repeats factor and the untiled dim can be sliced at once, not the operand's
    # minor part of a tiled dim.
    assert [f for f, _ in factor_mappings(rule, rule.sizes)] == [0, 2, 3]
    # Once the repeats are taken whole by a loop, the size can be sliced too.
    assert 1 in [f for f, _ in factor_mappings(rule, (1, 4, 5, 3))]


def test_tile_localizes_its_repeats():
    local = _view("tile", {"reps": (2, 3)}, [(2, 5)], [(2, 15)])
    assert CATALOGUE["tile"].localize(local)["reps"] == (1, 3)


def test_tile_with_its_operand_sharded_on_an_untiled_dim():
    def f(x):
        return jnp.sum(jnp.tile(x, (1, 2)), axis=1)

    x = _normal(16, 4)
    meta = _check(f, partir.Mesh({"batch": 8}), [partir.ManualPartition({"x": 0}, axis="batch")],
                  x)
    assert _gathers(meta) == 0 and meta.out_specs == (P("batch"),)


def test_tile_with_its_operand_sharded_on_a_tiled_dim():
    """The operand's dim is the minor part of the result's: the result stays whole."""
    def f(x):
        return jnp.tile(x, (2, 1)) * 2.0

    x = _normal(8, 4)
    meta = _check(f, partir.Mesh({"a": 2}), [partir.ManualPartition({"x": 0}, axis="a")], x)
    (conflict,) = meta.tactics[0].conflicts
    assert conflict["kind"] == "needs_replication" and "minor part" in conflict["detail"]
    assert meta.collectives["all_gather"] == 1


def test_tile_with_its_result_sharded_on_the_repeats():
    def f(x, y):
        return jnp.tile(x, (2, 1)) + y

    x, y = _normal(8, 4), _normal(16, 4)
    meta = _check(f, partir.Mesh({"a": 2}), [partir.ManualPartition({"y": 0}, axis="a")],
                  x, y)
    # Each device makes its own copy of x: nothing is gathered, x stays whole.
    assert _gathers(meta) == 0
    assert meta.in_specs[0] == P(None, None) and meta.out_specs == (P("a", None),)


def test_tile_with_its_result_sharded_on_the_repeats_and_the_size():
    """The result's dim on (a, b): a takes the repeats whole, b the operand's dim."""
    def f(x, y):
        return jnp.tile(x, (2, 1)) + y

    x, y = _normal(8, 4), _normal(16, 4)
    mesh = partir.Mesh({"a": 2, "b": 2})
    meta = _check(f, mesh, [partir.ManualPartition({"y": 0}, axis="a"),
                            partir.ManualPartition({"y": 0}, axis="b")], x, y)
    assert _gathers(meta) == 0
    assert meta.in_specs[0] == P("b", None) and meta.out_specs == (P(("a", "b"), None),)


def test_tile_of_a_size_1_dim_sharded_on_the_repeats():
    def f(x, y):
        return jnp.tile(x, (4, 1)) * y

    x, y = _normal(1, 6), _normal(4, 6)
    meta = _check(f, partir.Mesh({"a": 2}), [partir.ManualPartition({"y": 0}, axis="a")],
                  x, y)
    assert _gathers(meta) == 0 and meta.out_specs == (P("a", None),)


# --- stack --------------------------------------------------------------------------------


def test_stack_rule_passes_the_operands_dims_through():
    view = _view("stack", {"axis": 1}, [(4, 5)] * 3, [(4, 3, 5)])
    rule = CATALOGUE["stack"].rule(view)
    assert rule.sizes == (4, 5, 3)
    assert rule.operands == (((0,), (1,)),) * 3
    assert rule.results == (((0,), (2,), (1,)),)
    assert rule.factors[2].kind == REPLICATION and "operands" in rule.factors[2].why


def test_stack_under_batch_parallelism_gathers_nothing():
    def f(x, w):
        h = jnp.stack([x @ w, jnp.tanh(x @ w), x @ w * 2.0], axis=1)
        return jnp.sum(h, axis=(1, 2))

    x, w = _normal(16, 8), _normal(8, 4)
    meta = _check(f, partir.Mesh({"batch": 4}),
                  [partir.ManualPartition({"x": 0}, axis="batch", name="BP")], x, w)
    assert _gathers(meta) == 0 and meta.collectives.get("all_reduce", 0) == 0
    assert meta.out_specs == (P("batch"),)
    assert not meta.tactics[0].conflicts


def test_stack_gradient_unstacks_without_gathering():
    def loss(w, x):
        h = jnp.stack([x @ w, jnp.sin(x @ w)], axis=0)
        return jnp.sum(h * h)

    w, x = _normal(8, 4), _normal(16, 8)
    meta = _check(jax.grad(loss), partir.Mesh({"batch": 4}),
                  [partir.ManualPartition({"x": 0}, axis="batch")], w, x)
    assert _gathers(meta) == 0
