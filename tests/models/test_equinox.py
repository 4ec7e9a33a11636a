"""Equinox models, applied per example under `jax.vmap` as equinox intends: an
`eqx.nn.MLP` (its `Linear`s compute `weight @ x`, which vmap makes the einsum
"bi,oi->bo") under BP, BP+Z3 and BP+MP; and a small attention model using
`eqx.nn.RotaryPositionalEmbedding`, whose `jnp.tile` partir once took for its own identity
op `tile` (issue 27, cause 1: a wrong result, then a crash)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from partir import ManualPartition
from tests.models.harness import check_bp, check_megatron, check_zero3

B, D, H, C = 48, 16, 32, 8  # the batch's size differs from every other dimension
T, E = 8, 16  # sequence length and embedding size of the attention model
BP = ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP")
# Megatron on equinox's [out, in] weights: the first layer column-parallel (its outputs,
# dim 0), the second row-parallel (its inputs, dim 1).
MP = ManualPartition({"params/layers/0/weight": 0, "params/layers/0/bias": 0,
                      "params/layers/1/weight": 1}, axis="model", name="MP")


def training_step(static, tx: optax.GradientTransformation):
    """The step of an equinox model split by `eqx.partition` into its arrays (`params`)
    and the rest (`static`), applied per example under vmap."""
    def step(params, opt_state, x, y):
        def loss_fn(params):
            logits = jax.vmap(eqx.combine(params, static))(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, grads, optax.apply_updates(params, updates), opt_state
    return step


def setup(model, x_shape):
    params, static = eqx.partition(model, eqx.is_array)
    tx = optax.adam(1e-2)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    y = jnp.asarray(rng.integers(0, C, B), jnp.int32)
    return training_step(static, tx), (params, tx.init(params), x, y)


def mlp():
    return setup(eqx.nn.MLP(D, C, width_size=H, depth=2, key=jax.random.key(0)), (B, D))


@pytest.mark.slow
def test_mlp_bp():
    check_bp(*mlp(), BP, batch=B)


@pytest.mark.slow
def test_mlp_zero3():
    check_zero3(*mlp(), BP, batch=B)


@pytest.mark.slow
def test_mlp_megatron():
    # The weight gradients stay sharded over "model" like their weights (issue 27, cause
    # 5: the einsum's weight gradient was all_gathered, then all_reduced).
    check_megatron(*mlp(), BP, MP, batch=B, specs={
        "params/layers/0/weight": P("model", None), "params/layers/0/bias": P("model"),
        "params/layers/1/weight": P(None, "model")})


class RotaryAttention(eqx.Module):
    """One attention head over a sequence with rotary position embeddings on its queries
    and keys, mean-pooled into a classifier."""

    query: eqx.nn.Linear
    key: eqx.nn.Linear
    rope: eqx.nn.RotaryPositionalEmbedding
    head: eqx.nn.Linear

    def __init__(self, key):
        kq, kk, kh = jax.random.split(key, 3)
        self.query = eqx.nn.Linear(E, E, key=kq)
        self.key = eqx.nn.Linear(E, E, key=kk)
        self.rope = eqx.nn.RotaryPositionalEmbedding(E)
        self.head = eqx.nn.Linear(E, C, key=kh)

    def __call__(self, x):  # x: [T, E]
        q = self.rope(jax.vmap(self.query)(x))
        k = self.rope(jax.vmap(self.key)(x))
        attention = jax.nn.softmax(q @ k.T / np.sqrt(E), axis=-1)
        return self.head((attention @ x).mean(0))


def rotary_attention():
    return setup(RotaryAttention(jax.random.key(0)), (B, T, E))


@pytest.mark.slow
def test_rotary_attention_bp():
    check_bp(*rotary_attention(), BP, batch=B)


@pytest.mark.slow
def test_rotary_attention_zero3():
    check_zero3(*rotary_attention(), BP, batch=B)
