"""A flax nnx module (`nnx.Linear`, `nnx.BatchNorm`, `nnx.Dropout`) split with
`nnx.split` into a graph definition and its state (parameters, batch statistics, the
dropout stream's rng state): the training step is a pure function of that state, merged
back into a module inside it. Under BP, BP+Z3 and BP+MP."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from partir import ManualPartition
from tests.models.harness import check_bp, check_megatron, check_zero3
from tests.oracles import assert_tree_close

B, D, H, C = 48, 16, 32, 8  # the batch's size differs from every other dimension
BP = ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP")
# Megatron: l1 column-parallel (BatchNorm per feature with it), l2 row-parallel.
MP = ManualPartition({"params/l1/kernel": 1, "params/l1/bias": 0, "params/l2/kernel": 0},
                     axis="model", name="MP")


class Classifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(D, H, rngs=rngs)
        self.bn = nnx.BatchNorm(H, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.l2 = nnx.Linear(H, C, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))


def setup():
    graphdef, params, batch_stats, rngs = nnx.split(Classifier(nnx.Rngs(0)), nnx.Param,
                                                    nnx.BatchStat, ...)
    tx = optax.adam(1e-2)

    def step(params, batch_stats, rngs, opt_state, x, y):
        model = nnx.merge(graphdef, params, batch_stats, rngs)

        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        # nnx's own transform: under `jax.value_and_grad` of a function that merges the
        # module, BatchNorm's update of its statistics is refused (a variable mutated from
        # another trace level). The gradients are a state of the parameters.
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (loss, grads, optax.apply_updates(params, updates), opt_state,
                nnx.state(model, nnx.BatchStat))

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    y = jnp.asarray(rng.integers(0, C, B), jnp.int32)
    return step, (params, batch_stats, rngs, tx.init(params), x, y)


@pytest.mark.slow
def test_bp():
    c = check_bp(*setup(), BP, batch=B)
    # BatchNorm's running statistics, updated from the whole (sharded) batch.
    assert_tree_close(c.result[4], c.expected[4])


@pytest.mark.slow
def test_zero3():
    check_zero3(*setup(), BP, batch=B)


@pytest.mark.slow
def test_megatron():
    check_megatron(*setup(), BP, MP, batch=B, specs={
        "params/l1/kernel/value": P(None, "model"), "params/l1/bias/value": P("model"),
        "params/bn/scale/value": P("model"), "params/l2/kernel/value": P("model", None)})
