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

from partir import FIRST_DIVISIBLE_DIM, ManualPartition
from tests.models.harness import Expect, check_step, normalized
from tests.oracles import assert_tree_close

B, D, H, C = 48, 16, 32, 8  # the batch's size differs from every other dimension
BP8 = {"batch": 8}
BP4_MP2 = {"batch": 4, "model": 2}
BP = ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP")
Z3 = ManualPartition({"trainable": FIRST_DIVISIBLE_DIM, "opt_state": FIRST_DIVISIBLE_DIM},
                     axis="batch", name="Z3")
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


@pytest.mark.parametrize("schedule_name", [
    "BP", "BP+Z3", pytest.param("BP+MP", marks=pytest.mark.slow)])
def test_sequential(schedule_name):
    step, args = setup()
    if schedule_name == "BP":
        c = check_step(step, args, BP8, [BP], Expect(max_flops_ratio=0.2, batch=B))
        assert c.md.collectives["all_gather"] == 0, c.md.collectives
    elif schedule_name == "BP+Z3":
        # Each trainable variable's first dimension is divisible by 8: FIRST_DIVISIBLE_DIM
        # shards dimension 0, and the gradients are asked to come back the same way.
        grads = [P("batch")] * len(args[0])
        c = check_step(step, args, BP8, [BP, Z3], Expect(
            sharded={"trainable": "batch", "opt_state": "batch"}, grads_like="trainable",
            max_flops_ratio=0.2, batch=B), out_shardings=(None, grads, None, None, None))
        # ... and are placed so, as jax.jit places an output with out_shardings.
        assert [normalized(g.sharding.spec) for g in c.result[1]] == [("batch",)] * len(grads)
    else:
        c = check_step(step, args, BP4_MP2, [BP, MP], Expect(
            specs={"trainable/0": P(None, "model"), "trainable/1": P("model"),
                   "trainable/2": P("model"), "trainable/4": P("model", None)},
            grads_like="trainable", max_flops_ratio=0.25, batch=B))
    # The normalization's moving statistics, updated from the whole (sharded) batch.
    assert_tree_close(c.result[4], c.expected[4])
