"""An LSTM language model (a `lax.scan` over time steps, written as flax's LSTMCell does)
trained with SGD: under BP, BP+MP and BP+Z3 on 8 CPU devices its step equals the
unpartitioned one, no primitive is reported unsupported, and BP shards the batch through
the scan and its backward without gathering it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from partir.core.regions import structured
from tests.oracles import assert_tree_close

B, T, V, E, H = 8, 6, 16, 8, 8
MESH = {"batch": 4, "model": 2}


def lstm(params, tokens):
    x = jnp.take(params["embed"], tokens, axis=0)  # [B, T, E]

    def cell(carry, x_t):
        h, c = carry
        gates = jnp.concatenate([x_t, h], axis=-1) @ params["w"] + params["b"]
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    init = (jnp.zeros((tokens.shape[0], H)), jnp.zeros((tokens.shape[0], H)))
    _, hs = lax.scan(cell, init, jnp.swapaxes(x, 0, 1))  # [T, B, H]
    return jnp.swapaxes(hs, 0, 1) @ params["out"]  # [B, T, V]


def loss_fn(params, tokens, labels):
    logp = jax.nn.log_softmax(lstm(params, tokens), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def train_step(params, tokens, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, labels)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def inputs():
    rng = np.random.default_rng(0)
    params = {"embed": rng.normal(size=(V, E)), "w": rng.normal(size=(E + H, 4 * H)) / 4,
              "b": rng.normal(size=(4 * H,)) / 4, "out": rng.normal(size=(H, V)) / 4}
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    return params, tokens, labels


BP = partir.ManualPartition({"tokens": 0, "labels": 0}, axis="batch", name="BP")
SCHEDULES = {
    "BP": [BP],
    "BP+MP": [BP, partir.ManualPartition({"params/out": 1, "params/embed": 1},
                                         axis="model", name="MP")],
    "BP+Z3": [BP, partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM},
                                         axis="batch", name="Z3")],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SCHEDULES)
def test_lstm_training_step(name):
    args = inputs()
    expected = jax.jit(train_step)(*args)
    fn, meta = partir.jit(train_step, MESH, SCHEDULES[name])
    assert_tree_close(fn(*args), expected)
    assert not [c for t in meta.tactics for c in t.conflicts if c["kind"] == "unsupported"]
    result = partir.core_partition(train_step, MESH, SCHEDULES[name], *args)
    assert_tree_close(result.interpret(*args), expected)
    if name == "BP":
        assert meta.collectives["all_gather"] == 0, meta.hlo_ir
        scans = [op for op in structured(result.program).ops if op.name == "scan"]
        assert scans and all(structured(result.program).nest(op) for op in scans)
