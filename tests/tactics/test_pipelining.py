"""PipelinePartition: a scan over stacked layers run as a GPipe schedule over a stage axis.
Every pipelined program equals the unpartitioned function on both oracles (the Core
interpreter, the executed program); the executed collective_permutes are the schedule's
steps; scans it cannot pipeline are refused at the line that makes them so."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import partir
from examples.transformer import model
from examples.transformer.schedules import BP, MP
from tests.budget import examples
from tests.oracles import check_oracles

# The tiny transformer with a batch that 8 microbatches of 2 rows make up (BP+PP+MP).
WIDE_BATCH = model.Config(layers=4, batch=16, seq=8, heads=4, d_model=32, vocab=64)


def pp(microbatches: int) -> partir.PipelinePartition:
    return partir.PipelinePartition({"params/layers": 0}, axis="stage",
                                    microbatches=microbatches, name="PP")


@pytest.fixture(scope="module")
def tiny_scanned():
    return model.make_scanned_inputs(model.TINY)


@pytest.fixture(scope="module")
def wide_scanned():
    return model.make_scanned_inputs(WIDE_BATCH)


def _steps(stages: int, microbatches: int) -> int:
    return microbatches + stages - 1


@pytest.mark.slow
@pytest.mark.parametrize("microbatches", [1, 2, 4, 8])
def test_pp_runs_the_scan_over_layers_step_as_a_pipeline(tiny_scanned, microbatches):
    mesh = partir.Mesh({"stage": 4, "batch": 2})
    meta = check_oracles(model.train_step_scanned, mesh, [pp(microbatches)], *tiny_scanned)
    executed = meta.executed_collectives
    # One roll of the activations per step forward, one of their gradients backward; the
    # finished microbatches leave the last stage once per scan.
    assert executed["collective_permute"] == 2 * _steps(4, microbatches)
    assert executed["all_reduce"] == 2
    assert executed["all_gather"] == executed["all_to_all"] == 0
    params_specs = meta.in_specs[0]["layers"]
    assert params_specs["w_up"] == jax.sharding.PartitionSpec("stage", None, None)
    assert meta.in_specs[1][0].mu["layers"]["w_up"][0] == "stage"  # Adam follows


@pytest.mark.slow
@pytest.mark.parametrize("microbatches", [1, 2, 4, 8])
def test_bp_pp_mp_composes_the_pipeline_with_batch_and_megatron(wide_scanned, microbatches):
    mesh = partir.Mesh({"stage": 2, "batch": 2, "model": 2})
    meta = check_oracles(model.train_step_scanned, mesh, [BP, pp(microbatches), MP],
                         *wide_scanned)
    assert meta.executed_collectives["collective_permute"] == 2 * _steps(2, microbatches)
    assert meta.executed_collectives["all_gather"] == 0
    w_up = meta.in_specs[0]["layers"]["w_up"]
    assert w_up == jax.sharding.PartitionSpec("stage", None, "model")


def test_the_tactic_reports_stages_microbatches_and_the_bubble(tiny_scanned):
    meta = partir.partition(model.train_step_scanned, partir.Mesh({"stage": 4, "batch": 2}),
                            [pp(4)], *tiny_scanned)
    (record,) = meta.tactics
    assert record.actions[0] == 'tile<%params/layers/b_up,0,"stage">'
    assert any("4 stages of 1 layer, 4 microbatches: 7 steps" in n and "43%" in n
               for n in record.notes)
    # The only conflicts: the rolls' slices, each a permute to the next stage.
    assert {c["kind"] for c in record.conflicts} == {"shifted_tiles"}


# --- refusals ------------------------------------------------------------------------------


def test_stages_that_do_not_divide_the_layers_are_refused(tiny_scanned):
    with pytest.raises(partir.NotPipelineableError,
                       match="8 stages do not divide the 4 layers") as info:
        partir.partition(model.train_step_scanned, partir.Mesh({"stage": 8}), [pp(2)],
                         *tiny_scanned)
    assert info.value.loc.file == model.__file__  # the scan's line
    assert "lax.scan" in pathlib.Path(model.__file__).read_text().splitlines()[
        info.value.loc.line - 1]


def test_inputs_no_scan_iterates_over_are_refused(tiny_scanned):
    tactic = partir.PipelinePartition({"params/embed": 0}, axis="stage", microbatches=2)
    with pytest.raises(partir.NotPipelineableError, match="no scan of 64 iterations"):
        partir.partition(model.train_step_scanned, partir.Mesh({"stage": 4}), [tactic],
                         *tiny_scanned)


@pytest.mark.parametrize("kwargs, match", [
    ({"inputs": {"w": 1}}, "splits dimension 0"),
    ({"inputs": {}}, "non-empty dict"),
    ({"microbatches": 0}, "positive int"),
    ({"axis": 3}, "mesh axis name"),
])
def test_malformed_tactics_are_refused(kwargs, match):
    args = {"inputs": {"w": 0}, "axis": "stage", "microbatches": 2, **kwargs}
    with pytest.raises(partir.InvalidTacticError, match=match):
        partir.PipelinePartition(**args)


def _mlp_step(body):
    """value_and_grad of a loss over a scan of `body` over stacked weights w [L, D, D]."""
    def loss(w, x):
        h, _ = lax.scan(body, x, w)
        return jnp.mean(h ** 2)
    return jax.value_and_grad(loss)


def _mlp_args(layers: int = 4, batch: int = 8, width: int = 4):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(layers, width, width)) / 2, jnp.float32),
            jnp.asarray(rng.normal(size=(batch, width)), jnp.float32))


def _batch_norm_layer(h, w):
    h = h @ w
    h = h - jnp.mean(h, axis=0)  # statistics over the batch: examples mix
    return jnp.tanh(h), None


def test_a_layer_mixing_the_examples_of_a_batch_is_refused_at_its_line():
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=2)
    with pytest.raises(partir.NotPipelineableError, match="mixes the examples") as info:
        partir.partition(_mlp_step(_batch_norm_layer), partir.Mesh({"stage": 2}), [tactic],
                         *_mlp_args())
    assert info.value.loc.file == __file__
    line = pathlib.Path(__file__).read_text().splitlines()[info.value.loc.line - 1]
    assert "jnp.mean(h, axis=0)" in line


def test_a_batch_microbatches_do_not_divide_is_refused():
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=3)
    with pytest.raises(partir.NotPipelineableError, match="3 microbatches do not divide"):
        partir.partition(_mlp_step(lambda h, w: (jnp.tanh(h @ w), None)),
                         partir.Mesh({"stage": 2}), [tactic], *_mlp_args())


def test_a_carry_without_a_batch_is_refused():
    def loss(w, x):
        (h, total), _ = lax.scan(lambda c, wl: ((jnp.tanh(c[0] @ wl), c[1] + jnp.sum(wl)),
                                                None), (x, 0.0), w)
        return jnp.mean(h ** 2) + total
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=2)
    with pytest.raises(partir.NotPipelineableError, match="carry 1 of the scan"):
        partir.partition(jax.value_and_grad(loss), partir.Mesh({"stage": 2}), [tactic],
                         *_mlp_args())


def test_one_pipeline_per_schedule():
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=2)
    with pytest.raises(partir.InvalidTacticError, match="one PipelinePartition"):
        partir.partition(_mlp_step(lambda h, w: (jnp.tanh(h @ w), None)),
                         partir.Mesh({"stage": 2}), [tactic, tactic], *_mlp_args())


# --- random stacked-layer scans ------------------------------------------------------------


def _random_step(carries: int, reverse: bool, same: bool, cast: bool = False,
                 inner: bool = False):
    """value_and_grad of a loss over a scan of stacked layers {"w": [L, D, D], "b": [L, D]}
    carrying the activations [B, D] (and per-example running sums [B, 1]), stacking each
    layer's activations (and, with `same`, a value of its weights alone); with `cast`,
    the scan reads the layers rounded to bfloat16 and scaled (mixed precision, as models
    cast their parameters before the layers); with `inner`, a layer runs its cell twice in
    a loop of its own."""
    def layer(c, p):
        if inner:
            h, _ = lax.scan(lambda a, _: (jnp.tanh(a @ p["w"] + p["b"]), None), c[0], None,
                            length=2)
        else:
            h = jnp.tanh(c[0] @ p["w"] + p["b"])
        new = (h, *(ci * 0.5 + jnp.sum(h, axis=-1, keepdims=True) for ci in c[1:]))
        ys = (h * 2.0, *((jnp.sum(p["w"] ** 2),) if same else ()))
        return new, ys

    def loss(params, x):
        init = (x, *(jnp.ones((x.shape[0], 1), x.dtype) * k for k in range(1, carries)))
        if cast:
            params = jax.tree.map(
                lambda w: w.astype(jnp.bfloat16).astype(jnp.float32) * 0.75, params)
        c, ys = lax.scan(layer, init, params, reverse=reverse)
        return sum(jnp.mean(ci ** 2) for ci in c) + sum(jnp.mean(jnp.sin(y)) for y in ys)

    return jax.value_and_grad(loss)


@st.composite
def _pipelines(draw):
    stages = draw(st.sampled_from([1, 2, 4]))
    layers = stages * draw(st.sampled_from([1, 2]))
    microbatches = draw(st.sampled_from([1, 2, 4]))
    batch = microbatches * draw(st.sampled_from([1, 2]))
    width = draw(st.sampled_from([3, 4]))
    return (stages, layers, microbatches, batch, width, draw(st.integers(1, 2)),
            draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
            draw(st.booleans()), draw(st.booleans()))


@pytest.mark.slow
def test_a_two_stage_pipeline_of_two_carries_with_batch_parallelism():
    _check_pipeline((2, 4, 2, 4, 3, 2, False, True, True, False, False))


@pytest.mark.slow
def test_layers_cast_before_the_scan_are_pipelined():
    """The scan reads the layers through a cast and a scale (made layer by layer from
    them): it is the scan over the layers, pipelined, and the stages reach it through
    the cast."""
    _check_pipeline((4, 4, 2, 4, 3, 1, False, False, False, True, False))


@pytest.mark.slow
@settings(max_examples=examples(12), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_pipelines())
def test_random_stacked_layer_scans_pipeline_on_both_oracles(case):
    _check_pipeline(case)


def _check_pipeline(case):
    stages, layers, microbatches, batch, width, carries, reverse, same, bp, cast, inner = \
        case
    rng = np.random.default_rng(layers * 100 + batch)
    params = {"w": jnp.asarray(rng.normal(size=(layers, width, width)) / 2, jnp.float32),
              "b": jnp.asarray(rng.normal(size=(layers, width)) / 4, jnp.float32)}
    x = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)
    schedule = [partir.PipelinePartition({"params": 0}, axis="stage",
                                         microbatches=microbatches)]
    if bp:
        schedule.insert(0, partir.ManualPartition({"x": 0}, axis="batch"))
    mesh = partir.Mesh({"stage": stages, "batch": 8 // stages})
    meta = check_oracles(_random_step(carries, reverse, same, cast, inner), mesh, schedule,
                         params, x)
    if stages > 1:
        assert meta.executed_collectives["collective_permute"] == \
            2 * carries * _steps(stages, microbatches)


@pytest.mark.slow
def test_each_device_holds_its_stages_layers():
    """1 / S of the stacked parameters per device, as XLA's buffer assignment and the
    simulator both count the arguments."""
    w, x = _mlp_args(layers=8, batch=16, width=64)
    step = _mlp_step(lambda h, wl: (jnp.tanh(h @ wl), None))
    mesh = partir.Mesh({"stage": 4, "batch": 2})
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=4)
    for schedule, held in (([], w.nbytes), ([tactic], w.nbytes // 4)):
        fn, meta = partir.jit(step, mesh, schedule)
        xla = fn.lower(w, x).compile().memory_analysis()
        assert xla.argument_size_in_bytes == meta.cost.argument_bytes == held + x.nbytes


@pytest.mark.parametrize("microbatches", [1, 2, 4, 8])
def test_the_simulated_step_time_holds_the_bubble(microbatches):
    """On layers that dominate the step, the simulated pipelined step is the replicated
    one's over S, stretched by the bubble: 1 - t / (S t_pp) = (S - 1) / (M + S - 1)
    (within 5%: each step's own work, the roll and the bookkeeping, adds to it)."""
    stages = 4
    w = jax.ShapeDtypeStruct((16, 2048, 2048), jnp.float32)
    x = jax.ShapeDtypeStruct((256, 2048), jnp.float32)
    step = _mlp_step(lambda h, wl: (jnp.tanh(h @ wl), None))
    mesh = partir.Mesh({"stage": stages})
    whole = partir.partition(step, mesh, [], w, x).cost.step_time_s
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=microbatches)
    pipelined = partir.partition(step, mesh, [tactic], w, x).cost.step_time_s
    bubble = 1 - whole / (stages * pipelined)
    expected = (stages - 1) / (microbatches + stages - 1)
    assert abs(bubble / expected - 1) <= 0.05, (bubble, expected)


@pytest.mark.slow
def test_zero_composes_with_the_pipeline(wide_scanned):
    """ZeRO-3 inside each stage: a stage's stacked parameters sharded past the layer
    dimension, each layer's slice gathered in the step loops' bodies."""
    from examples.transformer.schedules import Z3
    mesh = partir.Mesh({"stage": 2, "batch": 2, "model": 2})
    meta = check_oracles(model.train_step_scanned, mesh, [BP, pp(4), MP, Z3], *wide_scanned)
    assert meta.executed_collectives["collective_permute"] == 2 * _steps(2, 4)
    w_up = meta.in_specs[0]["layers"]["w_up"]
    assert w_up == jax.sharding.PartitionSpec("stage", "batch", "model")


@pytest.mark.slow
def test_differentiating_a_pipelined_function_pipelines_its_backward_program():
    """partir.jit of a forward scan over layers: jax.grad of it is JAX's, through the
    VJP program, which the same schedule pipelines (the forward scan and the reversed one
    of its gradient: one permute per step of each)."""
    def loss(w, x):
        h, _ = lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)
        return jnp.mean(h ** 2)

    w, x = _mlp_args(layers=4, batch=8, width=4)
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=2)
    fn, meta = partir.jit(loss, partir.Mesh({"stage": 2, "batch": 4}), [tactic])
    np.testing.assert_allclose(fn(w, x), loss(w, x), rtol=1e-6)
    assert meta.executed_collectives["collective_permute"] == _steps(2, 2)
    np.testing.assert_allclose(jax.grad(fn)(w, x), jax.grad(loss)(w, x), rtol=1e-5,
                               atol=1e-7)
    assert fn.vjp.metadata.executed_collectives["collective_permute"] == 2 * _steps(2, 2)


def _inner_scan_layer(h, w):
    """A loop inside the layer (an RNN cell run twice, as SSM layers run theirs): its
    backward loop accumulates w's gradient over its steps, a sum over the batch."""
    h, _ = lax.scan(lambda c, _: (jnp.tanh(c @ w), None), h, None, length=2)
    return h, None


def _loops_and_branch_layer(h, w):
    """A scan stacking a per-example value at each step, a fori_loop and a cond on the
    weights, inside the layer."""
    def step(c, i):
        c = jnp.tanh(c @ w) * 0.5 + c * 0.5 + i * 0.01
        return c, c.sum(axis=1)

    h, ys = lax.scan(step, h, jnp.arange(3.0))
    h = lax.fori_loop(0, 2, lambda i, c: jnp.sin(c) + i, h)
    h = lax.cond(jnp.sum(w) > 0, lambda c: c * 2.0, lambda c: c - 1.0, h)
    return h + ys.T.mean(axis=1, keepdims=True), None


def _accumulating_layer(h, w):
    """A loop inside the layer adding a sum over the batch at each step to a carry that
    starts from the weights' sum, stacked by the layers for the loss: each microbatch
    accumulates its part of the sums and its share of the start."""
    def step(carry, _):
        c, total = carry
        c = jnp.tanh(c @ w)
        return (c, total + jnp.sum(c ** 2)), None

    (h, total), _ = lax.scan(step, (h, jnp.sum(w)), None, length=2)
    return h, total


@pytest.mark.slow
@pytest.mark.parametrize("layer", [_inner_scan_layer, _loops_and_branch_layer])
def test_loops_and_branches_inside_a_layer_run_on_microbatches(layer):
    """Each is lowered on the microbatches' axis as materialization lowers a loop's
    regions; a step's sum over the batch that only accumulates (a weight's gradient)
    accumulates the microbatch's part."""
    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=2)
    meta = check_oracles(_mlp_step(layer), partir.Mesh({"stage": 2, "batch": 4}), [tactic],
                         *_mlp_args())
    assert meta.executed_collectives["collective_permute"] == 2 * _steps(2, 2)


@pytest.mark.slow
def test_a_loop_accumulating_over_the_batch_starts_each_microbatch_from_its_share():
    def loss(w, x):
        h, totals = lax.scan(_accumulating_layer, x, w)
        return jnp.mean(h ** 2) + jnp.sum(totals) / 100

    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=4)
    check_oracles(jax.value_and_grad(loss), partir.Mesh({"stage": 2, "batch": 4}), [tactic],
                  *_mlp_args())


@pytest.mark.slow
def test_a_loop_combining_the_batch_at_each_step_is_refused_at_its_line():
    """A scan over the rows of the layer's weight: their gradients are a sum over the
    batch per step, stacked rather than accumulated, which one microbatch cannot make."""
    def layer(h, w):
        def step(c, row):
            c = c + jnp.tanh(row)[None, :] * c
            return c, None

        h, _ = lax.scan(step, h, w)
        return h, None

    tactic = partir.PipelinePartition({"w": 0}, axis="stage", microbatches=2)
    with pytest.raises(partir.NotPipelineableError,
                       match="combines values across the batch") as info:
        partir.partition(_mlp_step(layer), partir.Mesh({"stage": 2}), [tactic], *_mlp_args())
    assert info.value.loc.file == __file__
    # One microbatch keeps the layer as it is.
    check_oracles(_mlp_step(layer), partir.Mesh({"stage": 2, "batch": 4}),
                  [partir.PipelinePartition({"w": 0}, axis="stage")], *_mlp_args())
