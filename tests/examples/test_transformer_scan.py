"""The scan-over-layers transformer (`model.train_step_scanned`, the layers' parameters
stacked and the blocks run by `lax.scan`): batch parallelism goes through the scan, and
its backward, with no gathering, runs on 8 CPU devices equal to the unpartitioned step,
and runs per step the unrolled model's collectives: each layer's gradients are
all-reduced by the backward scan's body as it makes them."""

from __future__ import annotations

import jax
import optax
import pytest

import partir
from examples.transformer import model, schedules
from partir.core.regions import structured
from partir.pipeline import lower
from tests.oracles import assert_tree_close


@pytest.fixture(scope="module")
def inputs():
    return model.make_scanned_inputs(model.TINY)


@pytest.mark.slow
def test_batch_parallelism_goes_through_the_layer_scan(inputs):
    fn, meta = partir.jit(model.train_step_scanned, schedules.MESH, [schedules.BP])
    expected = jax.jit(model.train_step_scanned)(*inputs)
    assert_tree_close(fn(*inputs), expected)
    assert meta.tactics[0].conflicts == []
    # no activation (or anything else) is gathered; the program all-reduces the 9
    # stacked layer gradients in the backward scan's body, the embedding's and the loss
    assert meta.collectives["all_gather"] == 0
    assert meta.collectives["all_reduce"] == len(model.LAYER_PARAMS) + 2
    unrolled = partir.partition(model.train_step, schedules.MESH, [schedules.BP],
                                *model.make_inputs(model.TINY))
    # per step, each layer's 9 gradients are all-reduced, as in the unrolled model, with
    # the same bytes
    assert meta.executed_collectives["all_reduce"] == \
        unrolled.executed_collectives["all_reduce"] == \
        model.TINY.layers * len(model.LAYER_PARAMS) + 2
    assert unrolled.cost.bytes_moved["all_reduce"] == \
        pytest.approx(meta.cost.bytes_moved["all_reduce"])


@pytest.mark.slow
def test_the_scanned_step_interprets_equal_to_the_unpartitioned_step(inputs):
    result = partir.core_partition(model.train_step_scanned, schedules.MESH, [schedules.BP],
                                   *inputs)
    scans = [op for op in structured(result.program).ops if op.name == "scan"]
    assert len(scans) == 2 and all(structured(result.program).nest(op) for op in scans)
    assert_tree_close(result.interpret(*inputs), model.train_step_scanned(*inputs))


def _per_step(program) -> dict[tuple[str, tuple[str, ...]], int]:
    """The collectives run per step by kind and axes, a loop body's once per layer."""
    return lower(program).executed_by_axes()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MP", "BP+MP", "BP+MP+Z3"])
def test_megatron_goes_through_the_layer_scan_with_the_unrolled_models_reductions(
        inputs, name):
    """Megatron slices every layer's heads and hidden units through the scan (one loop
    slicing both, which the layer body keeps apart), summing each block's output over
    "model" inside the body: per step, as many all-reduces over "model" as the unrolled
    model, and the step runs on 8 devices equal to the unpartitioned one."""
    schedule = schedules.SCHEDULES[name]
    fn, meta = partir.jit(model.train_step_scanned, schedules.MESH, schedule)
    assert_tree_close(fn(*inputs), jax.jit(model.train_step_scanned)(*inputs))
    mp = next(t for t in meta.tactics if t.name == "MP")
    assert mp.conflicts == []
    for leaf, dim in schedules.MEGATRON_DIMS.items():
        assert mp.shardings[f"params/layers/{leaf}"][dim + 1] == ["model"], leaf
    scanned = _per_step(partir.core_partition(model.train_step_scanned, schedules.MESH,
                                              schedule, *inputs).program)
    unrolled = _per_step(partir.core_partition(model.train_step, schedules.MESH, schedule,
                                               *model.make_inputs(model.TINY)).program)
    # forward and backward: one sum per attention block and one per MLP, per layer
    assert scanned[("all_reduce", ("model",))] == 4 * model.TINY.layers
    # Per step, every collective runs as often as in the unrolled model: the gradients'
    # all-reduces over "batch" too, and ZeRO's reduce-scatters and all-gathers (each pass
    # gathering the weights it reads: test below).
    assert scanned == unrolled
    # the program holds one per block of each scan's body
    in_bodies = meta.executed_collectives["all_reduce"] - meta.collectives["all_reduce"]
    gradients = {"MP": 0, "BP+MP": len(model.LAYER_PARAMS), "BP+MP+Z3": 1}[name]
    assert in_bodies == (4 + gradients) * (model.TINY.layers - 1)
    if "Z3" not in name:  # and the simulator has them send the unrolled model's bytes
        unrolled_cost = partir.partition(model.train_step, schedules.MESH, schedule,
                                         *model.make_inputs(model.TINY)).cost
        assert meta.cost.bytes_moved["all_reduce"] == \
            pytest.approx(unrolled_cost.bytes_moved["all_reduce"])


@pytest.mark.slow
def test_zero3_keeps_the_stacked_parameters_sharded_gathering_one_layer_at_a_time(inputs):
    """BP+MP+Z3: ZeRO shards each stacked parameter past its layer dimension
    (`schedules.zero`); the scans' bodies all-gather a layer's slice when they take it,
    so no stacked parameter is ever gathered whole."""
    schedule = schedules.SCHEDULES["BP+MP+Z3"]
    fn, meta = partir.jit(model.train_step_scanned, schedules.MESH, schedule)
    assert_tree_close(fn(*inputs), jax.jit(model.train_step_scanned)(*inputs))
    z3 = meta.tactics[-1]
    assert z3.shardings["params/layers/w_up"] == [[], ["batch"], ["model"]]
    assert z3.shardings["opt_state/0/mu/layers/w_up"] == [[], ["batch"], ["model"]]
    result = partir.core_partition(model.train_step_scanned, schedules.MESH, schedule,
                                   *inputs)
    sites = lower(result.program).collective_sites()
    gathered = {name for (kind, _, name, *_) in sites if kind == "all_gather" and name}
    assert gathered == {"params/embed"}  # the unstacked embedding only
    # Per layer, the forward gathers the 8 tensors ZeRO shards (all but b_up, which MP
    # shards on its one dimension), the backward the 4 weight matrices again (ZeRO-3
    # gathers for each pass), as the unrolled model does.
    in_bodies = meta.executed_collectives["all_gather"] - meta.collectives["all_gather"]
    assert in_bodies == (8 + 4) * (model.TINY.layers - 1)
    # The backward's body reduce-scatters each layer's 8 gradients as it makes them:
    # per step, as many reduce-scatters as the unrolled model's.
    unrolled = partir.partition(model.train_step, schedules.MESH, schedule,
                                *model.make_inputs(model.TINY))
    assert meta.executed_collectives["reduce_scatter"] == \
        unrolled.executed_collectives["reduce_scatter"] == 8 * model.TINY.layers + 1
    # and the embedding, outside the scans, is gathered for each pass too
    assert meta.executed_collectives["all_gather"] == \
        unrolled.executed_collectives["all_gather"] == 12 * model.TINY.layers + 2


DROPOUT_RATE = 0.1


def _dropout(x: jax.Array, key: jax.Array) -> jax.Array:
    keep = jax.random.bernoulli(key, 1.0 - DROPOUT_RATE, x.shape)
    return jax.numpy.where(keep, x / (1.0 - DROPOUT_RATE), 0.0)


def _forward_with_dropout(params, tokens, key):
    """`forward_scanned` with dropout after each block's attention and MLP, its keys
    scanned beside the layers' parameters (as flax's `nn.scan` splits an rng per layer)."""
    embed = params["embed"]
    x = jax.numpy.take(embed, tokens, axis=0)
    seq = tokens.shape[1]
    causal = jax.numpy.tril(jax.numpy.ones((seq, seq), dtype=bool))

    def layer(x, p_key):
        p, k = p_key
        ka, km = jax.random.split(k)
        x = x + _dropout(model.attention(model.layer_norm(x, p["ln1_scale"], p["ln1_bias"]),
                                         p["w_qkv"], p["w_o"], causal), ka)
        return x + _dropout(model.mlp(model.layer_norm(x, p["ln2_scale"], p["ln2_bias"]),
                                      p["w_up"], p["b_up"], p["w_down"]), km), None

    keys = jax.random.split(key, model.TINY.layers)
    x, _ = jax.lax.scan(layer, x, (params["layers"], keys))
    return jax.numpy.einsum("bsd,vd->bsv", model.layer_norm(x), embed)


def _step_with_dropout(params, opt_state, batch, key):
    loss, grads = jax.value_and_grad(model.loss_fn)(
        params, batch, lambda p, t: _forward_with_dropout(p, t, key))
    updates, opt_state = model.OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@pytest.mark.slow
def test_dropout_in_the_layer_scan_keeps_the_batch_partitioned(inputs):
    """Dropout's random bits depend on each element's position: under BP each device
    draws its batch slice's bits at its own coordinate inside the scan's body, so the
    scans stay sliced by batch (no gather, per-device FLOPs about a quarter of the
    unpartitioned step's on "batch": 4) and both oracles equal the unpartitioned step."""
    key = jax.random.key(7)
    args = (*inputs, key)
    fn, meta = partir.jit(_step_with_dropout, schedules.MESH, [schedules.BP])
    expected = jax.jit(_step_with_dropout)(*args)
    assert_tree_close(fn(*args), expected)
    assert meta.tactics[0].conflicts == []
    assert meta.collectives["all_gather"] == 0
    result = partir.core_partition(_step_with_dropout, schedules.MESH, [schedules.BP], *args)
    scans = [op for op in structured(result.program).ops if op.name == "scan"]
    assert scans and all("batch" in [lp.axis for lp in structured(result.program).nest(op)]
                             for op in scans)
    assert_tree_close(result.interpret(*args), _step_with_dropout(*args))
    whole = partir.partition(_step_with_dropout, schedules.MESH, [], *args)
    assert meta.cost.flops / whole.cost.flops == pytest.approx(0.25, rel=0.1)
