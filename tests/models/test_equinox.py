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

from partir import FIRST_DIVISIBLE_DIM, ManualPartition
from tests.models.harness import Expect, check_step

B, D, H, C = 48, 16, 32, 8  # the batch's size differs from every other dimension
T, E = 8, 16  # sequence length and embedding size of the attention model
BP8 = {"batch": 8}
BP4_MP2 = {"batch": 4, "model": 2}
BP = ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP")
Z3 = ManualPartition({"params": FIRST_DIVISIBLE_DIM, "opt_state": FIRST_DIVISIBLE_DIM,
                      "out/1": FIRST_DIVISIBLE_DIM}, axis="batch", name="Z3")
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


@pytest.mark.parametrize("schedule_name", [
    "BP", pytest.param("BP+Z3", marks=pytest.mark.slow), "BP+MP"])
def test_mlp(schedule_name):
    mlp = eqx.nn.MLP(D, C, width_size=H, depth=2, key=jax.random.key(0))
    step, args = setup(mlp, (B, D))
    if schedule_name == "BP":
        c = check_step(step, args, BP8, [BP], Expect(max_flops_ratio=0.2, batch=B))
        assert c.md.collectives["all_gather"] == 0, c.md.collectives
    elif schedule_name == "BP+Z3":
        check_step(step, args, BP8, [BP, Z3], Expect(
            sharded={"params": "batch", "opt_state": "batch"}, grads_like="params",
            max_flops_ratio=0.2, batch=B))
    else:
        # The weight gradients stay sharded over "model" like their weights (issue 27,
        # cause 5: the einsum's weight gradient was all_gathered, then all_reduced).
        check_step(step, args, BP4_MP2, [BP, MP], Expect(
            specs={"params/layers/0/weight": P("model", None),
                   "params/layers/0/bias": P("model"),
                   "params/layers/1/weight": P(None, "model")},
            grads_like="params", max_flops_ratio=0.25, batch=B))


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


@pytest.mark.parametrize("schedule_name", [
    "BP", pytest.param("BP+Z3", marks=pytest.mark.slow)])
def test_rotary_attention(schedule_name):
    step, args = setup(RotaryAttention(jax.random.key(0)), (B, T, E))
    if schedule_name == "BP":
        c = check_step(step, args, BP8, [BP], Expect(max_flops_ratio=0.2, batch=B))
        assert c.md.collectives["all_gather"] == 0, c.md.collectives
    else:
        check_step(step, args, BP8, [BP, Z3], Expect(
            sharded={"params": "batch", "opt_state": "batch"}, grads_like="params",
            max_flops_ratio=0.2, batch=B))
