"""Propagation semantics on small programs, each checked against the interpreter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from partir.core.actions import Sum, Tile
from tests.oracles import check_oracles

rng = np.random.default_rng(0)
MESH = partir.Mesh({"a": 4, "b": 2})


def _run(fn, schedule, *args):
    r = partir.core_partition(fn, MESH, schedule, *args)
    want = jax.tree_util.tree_leaves(fn(*args))
    for i in range(len(schedule) + 1):
        got = jax.tree_util.tree_leaves(r.interpret(*args, after=i))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return r


def _nests(r, name):
    prog = r.program
    return [prog.nest(op) for op in prog.ops if op.name == name]


def f32(*shape):
    return rng.normal(size=shape).astype(np.float32)


def test_forward_and_backward_through_elementwise_chain():
    def f(x, y):
        return jnp.exp(x) * jnp.sin(y)

    r = _run(f, [partir.ManualPartition({"x": 1}, axis="a")], f32(4, 8), f32(4, 8))
    # y is sliced by inference, sin gets its loop by backward propagation
    for name in ("exp", "sin", "mul"):
        ((loop,),) = _nests(r, name)
        assert loop.axis == "a" and loop.results == (Tile(1),)
    assert str(r.program.input_shardings()["y"]) == '[{}, {"a"}]'


def test_contracting_dims_give_a_sum_and_reductions_their_monoid():
    def f(x, w):
        return jnp.max(x @ w, axis=1)

    r = _run(f, [partir.ManualPartition({"w": 1}, axis="a")], f32(8, 16), f32(16, 8))
    ((loop,),) = _nests(r, "reduce_max")
    assert loop.results == (Sum("max"),)
    r = _run(f, [partir.ManualPartition({"x": 1}, axis="a")], f32(8, 16), f32(16, 8))
    ((loop,),) = _nests(r, "dot_general")
    assert loop.results == (Sum("add"),) and loop.operands == (1, 0)


def test_atomic_keeps_an_operand_replicated():
    def f(x, y):
        return x + y

    r = _run(f, [partir.ManualPartition({"y": partir.REPLICATED, "x": 0}, axis="a")],
             f32(8, 4), f32(8, 4))
    assert [c.kind for c in r.conflicts] == ["replicated_operand"]
    assert _nests(r, "add") == [()]


def test_a_barrier_keeps_a_value_whole_and_lets_its_readers_slice_it():
    def f(x, y):
        return x + y

    r = _run(f, [partir.ManualPartition({"y": partir.BARRIER, "x": 0}, axis="a")],
             f32(8, 4), f32(8, 4))
    assert r.conflicts == []
    ((loop,),) = _nests(r, "add")
    assert loop.results == (Tile(0),) and loop.operands == (0, 0)
    assert str(r.program.input_shardings()["y"]) == '[{}, {}]'
    assert r.tactics[0].actions[0] == 'barrier<%y,"a">'


def _across(a, w, b):
    h = partir.tag(a @ w, "h")
    return h * b


def test_a_barrier_meets_two_layouts_with_an_all_to_all():
    """The product is sharded by columns (w's), its reader by rows (b's): the barrier
    keeps either from deciding the other, and the executed program moves the product from
    one layout to the other with one all_to_all, where REPLICATED keeps the reader whole."""
    args = f32(8, 8), f32(8, 8), f32(8, 8)
    layouts = partir.ManualPartition({"w": 1, "b": 0}, axis="a")
    barrier = [partir.ManualPartition({"h": partir.BARRIER}, axis="a"), layouts]
    r = _run(_across, barrier, *args)
    assert r.conflicts == []
    ((loop,),) = _nests(r, "mul")
    assert loop.results == (Tile(0),)
    meta = check_oracles(_across, MESH, barrier, *args)
    assert {k: v for k, v in meta.collectives.items() if v} == {"all_to_all": 1}
    replicated = [partir.ManualPartition({"h": partir.REPLICATED}, axis="a"), layouts]
    assert [c.kind for c in _run(_across, replicated, *args).conflicts] == [
        "replicated_operand"]


def test_indivisible_dimension_blocks_propagation_with_a_record():
    def f(x, w):
        return (x @ w).sum(axis=1)

    r = _run(f, [partir.ManualPartition({"x": 1}, axis="a")], f32(8, 4), f32(4, 6))
    assert r.conflicts == []
    r = _run(f, [partir.ManualPartition({"w": 0}, axis="a"),
                 partir.ManualPartition({"w": 1}, axis="b")], f32(8, 4), f32(4, 6))
    assert r.tactics[1].conflicts == []


def test_unsupported_primitive_blocks_and_is_reported():
    def f(x):
        y = jnp.tanh(x)
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(y.shape, y.dtype), y)

    r = _run(f, [partir.ManualPartition({"x": 0}, axis="a")], f32(8, 8))
    (c,) = r.unsupported
    assert c.op == "pure_callback" and c.kind == "unsupported" and c.axis == "a"
    assert c.loc.file == __file__ and c.loc.line > 0
    assert _nests(r, "pure_callback") == [()]
    ((loop,),) = _nests(r, "tanh")
    assert loop.results == (Tile(0),)


def test_operands_tiled_on_different_dims_are_a_conflict():
    def f(x, y, z):
        h = jnp.sin(x)
        return h + y, h.T + z

    # y's tiling reaches h first (program order); h.T then meets z tiled the other way
    r = _run(f, [partir.ManualPartition({"y": 0, "z": 0}, axis="a")], f32(8, 8), f32(8, 8),
             f32(8, 8))
    (c,) = r.conflicts
    assert (c.kind, c.op) == ("multiple_matches", "add")
    assert c.choices == ("(#tile<0>, #tile<0>) -> #tile<0>", "(#tile<1>, #tile<1>) -> #tile<1>")


def test_second_axis_refines_the_first_on_the_same_dim():
    def f(x):
        return jnp.cumsum(x * 2.0, axis=1)

    r = _run(f, [partir.ManualPartition({"x": 0}, axis="a"),
                 partir.ManualPartition({"x": 0}, axis="b")], f32(16, 4))
    assert str(r.program.output_shardings()["out"]) == '[{"a", "b"}, {}]'
    assert str(r.program.input_shardings()["x"]) == '[{"a", "b"}, {}]'


def test_tags_can_be_tiled_like_inputs():
    def f(x, w):
        h = partir.tag(jnp.tanh(x @ w), "hidden")
        return h.sum(axis=0)

    r = _run(f, [partir.ManualPartition({"hidden": 1}, axis="b")], f32(8, 4), f32(4, 6))
    assert str(r.program.input_shardings()["w"]) == '[{}, {"b"}]'
    assert str(r.program.output_shardings()["out"]) == '[{"b"}]'


def test_a_sliced_dim_the_op_cannot_slice_is_reported_with_why():
    def f(x):
        merged = jnp.tanh(x).reshape(32)  # dim 1 of x is the minor part of the merge
        return jnp.sort(jnp.tanh(x), axis=1), merged

    r = _run(f, [partir.ManualPartition({"x": 1}, axis="b")], f32(4, 8))
    by_op = {c.op: c for c in r.conflicts}
    assert by_op["sort"].kind == "needs_replication"
    assert by_op["sort"].detail == "dimension 1 of operand 0 needs replication"
    assert by_op["reshape"].kind == "needs_replication"
    assert "minor part of a dimension the op splits or merges" in by_op["reshape"].detail
    assert _nests(r, "sort") == [()] and _nests(r, "reshape") == [()]


def test_a_split_keeps_the_sharding_of_its_major_part():
    def f(x):
        return jnp.tanh(x).reshape(4, 2, 8) * 2.0

    r = _run(f, [partir.ManualPartition({"x": 0}, axis="b")], f32(8, 8))
    ((loop,),) = _nests(r, "reshape")
    assert (loop.operands, loop.results) == ((0,), (Tile(0),))
    assert r.conflicts == []


def test_a_value_is_a_barrier_or_tiled_once_per_axis():
    def f(x):
        return x * 2

    with pytest.raises(partir.AlreadyTiledError, match="already a propagation barrier"):
        partir.core_partition(f, MESH, [partir.ManualPartition({"x": partir.BARRIER}, "a"),
                                        partir.ManualPartition({"x": 0}, "a")], f32(8, 4))
