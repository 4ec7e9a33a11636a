"""A dm-haiku MLP (`hk.transform` of `hk.Linear` layers) whose training step also keeps an
exponential moving average of the parameters (`hk.EMAParamsTree` under
`hk.transform_with_state`), under BP, BP+Z3 and BP+MP. The EMA's state holds, per
parameter, a `hidden` value and a debiased `average` the update writes but never reads
(issue 27, cause 7: such an input lost the sharding asked for it)."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from partir import ManualPartition
from tests.models.harness import check_bp, check_megatron, check_zero3

B, D, H, C = 48, 16, 32, 8  # the batch's size differs from every other dimension
BP = ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP")
# Megatron on haiku's [in, out] weights: linear column-parallel, linear_1 row-parallel.
MP = ManualPartition({"params/linear/w": 1, "params/linear/b": 0,
                      "params/linear_1/w": 0}, axis="model", name="MP")


@hk.without_apply_rng
@hk.transform
def mlp(x):
    h = jax.nn.relu(hk.Linear(H)(x))
    return hk.Linear(C)(h)


ema = hk.without_apply_rng(hk.transform_with_state(lambda p: hk.EMAParamsTree(0.9)(p)))
TX = optax.adam(1e-2)


def step(params, ema_state, opt_state, x, y):
    def loss_fn(params):
        logits = mlp.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = TX.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    _, ema_state = ema.apply(None, ema_state, params)
    return loss, grads, params, opt_state, ema_state


def inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    y = jnp.asarray(rng.integers(0, C, B), jnp.int32)
    params = mlp.init(jax.random.key(0), x)
    _, ema_state = ema.init(None, params)
    return params, ema_state, TX.init(params), x, y


@pytest.mark.slow
def test_bp():
    check_bp(step, inputs(), BP, batch=B)


def test_zero3():
    # ZeRO-3 of everything a replica keeps: parameters, Adam's moments and the EMA, whose
    # `average` leaves the step writes but never reads.
    check_zero3(step, inputs(), BP, batch=B, state=("params", "opt_state", "ema_state"))


@pytest.mark.slow
def test_megatron():
    check_megatron(step, inputs(), BP, MP, batch=B, specs={
        "params/linear/w": P(None, "model"), "params/linear/b": P("model"),
        "params/linear_1/w": P("model", None)})
