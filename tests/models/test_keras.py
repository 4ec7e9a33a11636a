"""A keras 3 `Sequential` of `Dense` layers (and a `BatchNormalization`, whose moving
statistics are non-trainable variables) run on JAX through `model.stateless_call(trainable,
non_trainable, x)`, the step a pure function of the variables' values. Under BP, BP+Z3
(the gradients' layout asked with `out_shardings`, as a `jax.jit` user would) and BP+MP.
tests/models/conftest.py sets KERAS_BACKEND=jax before keras is imported."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from partir import ManualPartition
from tests.models.harness import check_bp, check_megatron, check_zero3, normalized
from tests.oracles import assert_tree_close

B, D, H, C = 48, 16, 32, 8  # the batch's size differs from every other dimension
BP = ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP")
# The trainable variables in layer order: dense kernel [D, H] and bias, the
# normalization's gamma and beta, dense_1 kernel [H, C] and bias. Megatron: dense
# column-parallel (the normalization per feature with it), dense_1 row-parallel.
MP = ManualPartition({"trainable/0": 1, "trainable/1": 0, "trainable/4": 0}, axis="model",
                     name="MP")


def setup():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(H),
                              keras.layers.BatchNormalization(),
                              keras.layers.Activation("relu"), keras.layers.Dense(C)])
    tx = optax.adam(1e-2)

    def step(trainable, non_trainable, opt_state, x, y):
        def loss_fn(trainable):
            logits, non_trainable_new = model.stateless_call(trainable, non_trainable, x,
                                                             training=True)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, non_trainable_new

        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return loss, grads, optax.apply_updates(trainable, updates), opt_state, non_trainable

    trainable = [jnp.asarray(v.value) for v in model.trainable_variables]
    non_trainable = [jnp.asarray(v.value) for v in model.non_trainable_variables]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    y = jnp.asarray(rng.integers(0, C, B), jnp.int32)
    return step, (trainable, non_trainable, tx.init(trainable), x, y)


@pytest.mark.slow
def test_bp():
    c = check_bp(*setup(), BP, batch=B)
    # The normalization's moving statistics, updated from the whole (sharded) batch.
    assert_tree_close(c.result[4], c.expected[4])


@pytest.mark.slow
def test_zero3():
    # Each trainable variable's first dimension is divisible by 8: ZeRO-3 shards dimension
    # 0, and the gradients are asked to come back the same way with `out_shardings` ...
    step, args = setup()
    grads = [P("batch")] * len(args[0])
    c = check_zero3(step, args, BP, batch=B, state=("trainable", "opt_state"),
                    out_shardings=(None, grads, None, None, None))
    # ... and are placed so, as jax.jit places an output with out_shardings.
    assert [normalized(g.sharding.spec) for g in c.result[1]] == [("batch",)] * len(grads)


@pytest.mark.slow
def test_megatron():
    check_megatron(*setup(), BP, MP, batch=B, params="trainable", specs={
        "trainable/0": P(None, "model"), "trainable/1": P("model"),
        "trainable/2": P("model"), "trainable/4": P("model", None)})
