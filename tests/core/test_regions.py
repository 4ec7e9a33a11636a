"""Control-flow ops flattened into the Core module (`partir.core.regions`, the
`partir.enter`/`partir.exit` edge ops of `partir.rules.edges`): propagation runs through
a body's ops as through any other code. Stage 1 of issue 28 (propagation only: the
flattened module is not yet materialized or lowered)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from examples.transformer import model, schedules
from partir.core.module import CoreModule
from partir.core.propagation import propagate
from partir.core.value_actions import tile_value
from partir.frontend import trace
from partir.mesh import Mesh
from partir.pipeline import lower
from partir.rules.catalogue import region_ops
from partir.rules.edges import ENTER, EXIT
from partir.tactics.driver import apply_tactic
from tests.oracles import assert_tree_close


def _flat(f, *args, mesh):
    traced = trace(f, *args)
    return traced, CoreModule(traced, Mesh(mesh))


def _tile(m, traced, name, dim, axis):
    value = dict(zip(traced.input_names, m.args, strict=True))[name]
    propagate(m, tile_value(m, value, dim, axis, label=name))


def _axes(m, op):
    return {lp.axis: (tuple(map(str, lp.results)), lp.operands) for lp in m.nest(op.uid)}


def test_a_body_is_flattened_between_its_edges_in_program_order():
    traced, m = _flat(lambda w, x: lax.scan(lambda c, _: (jnp.tanh(c @ w), jnp.sum(c, 1)),
                                            x, None, length=3),
                      jnp.ones((4, 4)), jnp.ones((8, 4)), mesh={"batch": 2})
    assert [op.name for op in m.ops] == [ENTER, ENTER, "dot_general", "tanh", "reduce_sum",
                                         EXIT]
    assert [op.order for op in m.ops] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                                          (0, 1, 2), (0, 2, 0)]
    (scan,) = traced.function.ops
    body = scan.regions[0]
    # the carry: its init and the yield fed back; its argument, and the loop's result
    assert m.ops[1].operands == (scan.operands[1], body.yields[0])
    assert m.ops[1].results == (body.args[1], scan.results[0])
    assert m.ops[5].results == (scan.results[1],)  # the stacked result


def test_batch_parallelism_goes_through_the_carry_and_the_body():
    traced, m = _flat(lambda w, x: lax.scan(lambda c, _: (jnp.tanh(c @ w), jnp.sum(c, 1)),
                                            x, None, length=3),
                      jnp.ones((4, 4)), jnp.ones((8, 4)), mesh={"batch": 2})
    _tile(m, traced, "x", 0, "batch")
    assert m.conflicts == {}
    by_name = {op.name: op for op in m.ops if op.name != ENTER and op.name != EXIT}
    assert _axes(m, by_name["dot_general"]) == {"batch": (("#tile<0>",), (0, None))}
    enter_w, enter_c = (op for op in m.ops if op.name == ENTER)
    assert m.nest(enter_w.uid) == ()  # the weights stay whole
    # init and yield sliced, argument and result tiled alike
    assert _axes(m, enter_c) == {"batch": (("#tile<0>", "#tile<0>"), (0, 0))}
    exit_ys = m.ops[-1]
    assert _axes(m, exit_ys) == {"batch": (("#tile<1>",), (0,))}  # stacked: dim 1


def test_megatron_in_a_scan_over_layers_sums_inside_the_body():
    def f(ws, wd, x):
        return lax.scan(lambda c, p: (c + jnp.tanh(c @ p[0]) @ p[1], None), x, (ws, wd))[0]

    traced, m = _flat(f, jnp.ones((3, 4, 16)), jnp.ones((3, 16, 4)), jnp.ones((8, 4)),
                      mesh={"batch": 2, "model": 2})
    _tile(m, traced, "x", 0, "batch")
    _tile(m, traced, "ws", 2, "model")
    assert m.conflicts == {}
    dots = [op for op in m.ops if op.name == "dot_general"]
    assert _axes(m, dots[1])["model"] == (("#sum",), (1, 0))
    # backward from the body's contraction to the scanned operand: wd's dim 1 (its slice's
    # dim 0) on "model", its scanned dimension whole
    enter_wd = next(op for op in m.ops if op.name == ENTER and op.operands[0].type.shape
                    == (3, 16, 4))
    assert _axes(m, enter_wd) == {"model": (("#tile<0>",), (1,))}


def test_the_scanned_transformer_step_propagates_as_the_unrolled_one():
    """BP, MP and BP+MP through the layer scans of the training step with no conflict,
    every body op of the forward and backward scans looped as the schedule asks."""
    inputs = model.make_scanned_inputs(model.TINY)
    for name, axes in (("BP", {("batch",)}), ("MP", {("model",)}),
                       ("BP+MP", {("batch",), ("batch", "model")})):
        traced, m = _flat(model.train_step_scanned, *inputs, mesh=schedules.MESH)
        names = {n: [v] for n, v in zip(traced.input_names, m.args, strict=True)}
        records = [apply_tactic(m, t, names) for t in schedules.SCHEDULES[name]]
        assert [c for r in records for c in r.conflicts] == []
        body = [op for op in m.ops if len(op.order) > 1 and op.name not in (ENTER, EXIT)
                and not op.is_identity]
        looped = collections.Counter(tuple(lp.axis for lp in m.nest(op.uid)) for op in body)
        assert axes <= set(looped), (name, looped)


def test_a_tactic_on_a_loop_result_acts_after_the_loop():
    """The identity op a tactic puts on a carry's result sorts after the loop's regions
    (where the result exists), not after the edge op that makes it before the body."""
    _, m = _flat(lambda x: lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=2)[0],
                 jnp.ones((8, 4)), mesh={"batch": 2})
    (out,) = m.results
    propagate(m, tile_value(m, out, 0, "batch", label="out"))
    tile = next(op for op in m.ops if op.is_identity)
    tanh = next(op for op in m.ops if op.name == "tanh")
    assert m.ops.index(tile) > m.ops.index(tanh)
    assert m.results == [tile.results[0]]
    assert m.conflicts == {}
    assert "batch" in _axes(m, tanh)  # backward through the carry into the body


def _mqa_decode(wq, wkv, wo, x0):
    """A multi-query decode loop: one key/value head, its caches carried, written at each
    step's position."""
    b = x0.shape[0]
    t, dh = 6, wkv.shape[-1]
    caches = (partir.tag(jnp.zeros((b, t, dh)), "cache_k"),
              partir.tag(jnp.zeros((b, t, dh)), "cache_v"))

    def step(carry, pos):
        x, kc, vc = carry
        x = partir.tag(x, "resid")
        q = jnp.einsum("bd,dhk->bhk", x, wq)
        kv = jnp.einsum("bd,dtk->tbk", x, wkv)
        kc = lax.dynamic_update_slice(kc, kv[0][:, None], (0, pos, 0))
        vc = lax.dynamic_update_slice(vc, kv[1][:, None], (0, pos, 0))
        p = jax.nn.softmax(jnp.einsum("bhk,btk->bht", q, kc), axis=-1)
        x = x + jnp.einsum("bhk,hkd->bd", jnp.einsum("bht,btk->bhk", p, vc), wo)
        return (jnp.tanh(x), kc, vc), None

    return lax.scan(step, (x0, *caches), jnp.arange(t, dtype=jnp.int32))[0][0]


@pytest.mark.slow
def test_multi_query_caches_split_by_batch_move_the_queries_with_an_all_to_all_per_step():
    """Issue 28 item 6's capability: the caches carried split by batch over "model"
    (the residual stream kept whole on it), Megatron's query heads over "model" too; the
    body's ops take each layout where propagation put it, and the queries cross from
    heads to batch with an all_to_all inside the loop, each step. Both oracles."""
    rng = np.random.default_rng(0)
    wq, wkv, wo, x0 = (jnp.asarray(rng.normal(size=s).astype(np.float32)) * 0.3
                       for s in ((16, 4, 4), (16, 2, 4), (4, 4, 16), (8, 16)))
    schedule = [partir.ManualPartition({"x0": 0}, axis="batch"),
                partir.ManualPartition({"cache_k": 0, "cache_v": 0,
                                        "resid": partir.REPLICATED}, axis="model"),
                partir.ManualPartition({"wq": 1, "wo": 0}, axis="model")]
    mesh = {"batch": 2, "model": 2}
    expected = _mqa_decode(wq, wkv, wo, x0)
    result = partir.core_partition(_mqa_decode, mesh, schedule, wq, wkv, wo, x0)
    assert_tree_close(result.interpret(wq, wkv, wo, x0), expected)
    fn, meta = partir.jit(_mqa_decode, mesh, schedule)
    assert_tree_close(fn(wq, wkv, wo, x0), expected)
    (scan,) = [op for op in lower(result.program).hlo.ops if op.name == "scan"]
    assert "hlo.all_to_all" in {inner.name for inner, _ in region_ops(scan)}
    assert meta.executed_collectives["all_to_all"] == 6  # one per step


@pytest.mark.slow
def test_control_flow_ops_whose_only_edges_are_results_are_restructured():
    """A cond of constants and a scan of no operands have exit edges only: each is one op
    again after the tactics, and the program equals the function on both oracles."""
    def f(x, p):
        c = lax.cond(p > 0, lambda: jnp.float32(1.), lambda: jnp.float32(2.))
        ys = lax.scan(lambda c, _: (c, jnp.arange(3.)), None, None, length=4)[1]
        return x * c + jnp.sum(ys)

    x, p = jnp.arange(8.), jnp.int32(1)
    schedule = [partir.ManualPartition({"x": 0}, axis="a")]
    result = partir.core_partition(f, {"a": 4}, schedule, x, p)
    assert_tree_close(result.interpret(x, p), f(x, p))
    fn, _ = partir.jit(f, {"a": 4}, schedule)
    assert_tree_close(fn(x, p), f(x, p))
    ops = lower(result.program).hlo.ops
    assert {"cond", "scan"} <= {op.name for op in ops}
    assert not {ENTER, EXIT} & {op.name for op in ops}


def _scaled_twice(x, scales):
    """Two scans over layers, the second reading the first one's per-layer residual of a
    weight (as a backward scan reads the broadcast layer-norm scale its forward saved)."""
    def forward(c, s):
        b = jnp.broadcast_to(s, (1, s.shape[0]))
        return jnp.tanh(c * b), b

    c, bs = lax.scan(forward, x, scales)
    return lax.scan(lambda c, b: (c * b, None), c, bs)[0]


def test_a_residual_the_body_gathers_anyway_leaves_it_gathered():
    """ZeRO-3 after batch parallelism: the first body gathers each layer's scale slice for
    its product with the batch-sliced carry, and yields that gathered residual, so the
    second body reads it whole instead of gathering it again: one all_gather per layer,
    as the unrolled layers (one value, one gather for both uses) run. Both oracles."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(8, 4)).astype(np.float32))
    scales = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
    schedule = [partir.ManualPartition({"x": 0}, axis="batch"),
                partir.ManualPartition({"scales": 1}, axis="batch")]
    expected = _scaled_twice(x, scales)
    result = partir.core_partition(_scaled_twice, {"batch": 4}, schedule, x, scales)
    assert_tree_close(result.interpret(x, scales), expected)
    fn, meta = partir.jit(_scaled_twice, {"batch": 4}, schedule)
    assert_tree_close(fn(x, scales), expected)
    assert meta.executed_collectives["all_gather"] == 3
    first, second = [op for op in lower(result.program).hlo.ops if op.name == "scan"]
    assert [inner.name for inner, _ in region_ops(first)].count("hlo.all_gather") == 1
    assert "hlo.all_gather" not in {inner.name for inner, _ in region_ops(second)}


def test_a_region_argument_sliced_with_padding_inside_the_body_arrives_whole():
    """Fuzzer seed 178: a cond's operand kept whole at its edge (`REPLICATED` outside) and
    sliced, padded (2 over 3 devices), by a body op: the region takes it whole, as the
    other branch does, and slices it itself; the lowering must not make it arrive sliced
    (`localize_padded_arguments`), which gave the branches different argument types."""
    def f(x, w):
        def contract(c):
            return c * 0.5 + jnp.einsum("ab,ba->a", lax.dot_general(
                c, c, (((0,), (0,)), ((), ()))), w)
        return lax.cond(jnp.sum(x) > 0.5, contract, lambda c: c, x)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(8, 2)).astype(np.float32))
    w = jnp.asarray(rng.normal(size=(2, 2)).astype(np.float32))
    schedule = [partir.ManualPartition({"x": 1, "w": partir.REPLICATED}, axis="a")]
    result = partir.core_partition(f, {"a": 3}, schedule, x, w)
    assert_tree_close(result.interpret(x, w), f(x, w))
    fn, _ = partir.jit(f, {"a": 3}, schedule)
    assert_tree_close(fn(x, w), f(x, w))
