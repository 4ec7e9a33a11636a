"""A flax linen classifier's training step under BP, BP+Z3 and BP+MP: `nn.Dense`,
`nn.BatchNorm` (its batch statistics a mutable collection, returned by the step),
`nn.Dropout` (the rng passed in), a `nn.remat` layer and a `nn.scan` over a stacked
layer; and a model whose parameters carry logical partitioning metadata
(`nn.with_logical_partitioning`), partitioned by those specs."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir import UNKNOWN, ManualPartition
from tests.models.harness import (
    BP4_MP2,
    Expect,
    check_bp,
    check_megatron,
    check_step,
    check_zero3,
)
from tests.oracles import assert_tree_close

B, D, H, C = 48, 16, 32, 8  # the batch's size differs from every other dimension
BP = ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP")


class Layer(nn.Module):
    """The scanned layer: a dense layer, and dropout if asked."""

    dropout: bool

    @nn.compact
    def __call__(self, h, _):
        h = nn.relu(nn.Dense(H)(h))
        if self.dropout:
            h = nn.Dropout(0.1, deterministic=False)(h)
        return h, None


class Classifier(nn.Module):
    dropout_in_scan: bool = False

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(H)(x)
        h = nn.relu(nn.BatchNorm(use_running_average=False, momentum=0.9)(h))
        h = nn.Dropout(0.1, deterministic=False)(h)
        h = nn.relu(nn.remat(nn.Dense)(H)(h))
        stack = nn.scan(Layer, variable_axes={"params": 0},
                        split_rngs={"params": True, "dropout": True}, length=2)
        h, _ = stack(self.dropout_in_scan, name="stack")(h, None)
        return nn.Dense(C)(h)


def make_step(model: nn.Module, tx: optax.GradientTransformation):
    def step(params, batch_stats, opt_state, x, y, key):
        def loss_fn(params):
            logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, x,
                                          rngs={"dropout": key}, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, updates["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, grads, optax.apply_updates(params, updates), opt_state, stats
    return step


def inputs(model: nn.Module, tx: optax.GradientTransformation):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    y = jnp.asarray(rng.integers(0, C, B), jnp.int32)
    variables = model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x)
    params = variables["params"]
    return params, variables["batch_stats"], tx.init(params), x, y, jax.random.PRNGKey(2)


def megatron(dims: dict[str, int]):
    """Shards each parameter named in `dims` by its path ("Dense_0/kernel"), and its Adam
    moments, on that dimension; the others are left to propagation."""
    def dim(name: str, shape: tuple[int, ...]):
        path = name.removeprefix("params/").removeprefix("opt_state/0/mu/")
        return dims.get(path.removeprefix("opt_state/0/nu/"), UNKNOWN)
    return dim


# The first dense layer column-parallel (and BatchNorm with it, per feature), the remat'd
# one (CheckpointDense_0) row-parallel: an all_reduce over "model" after it. The scanned
# layers and the head stay replicated over "model".
MP_DIMS = {"Dense_0/kernel": 1, "Dense_0/bias": 0, "CheckpointDense_0/kernel": 0}
MP = ManualPartition({"params": megatron(MP_DIMS), "opt_state": megatron(MP_DIMS)},
                     axis="model", name="MP")


def setup(dropout_in_scan: bool = False):
    model, tx = Classifier(dropout_in_scan), optax.adam(1e-2)
    return make_step(model, tx), inputs(model, tx)


@pytest.mark.slow
def test_bp():
    # Nothing to gather: the matmuls, BatchNorm's statistics (a sum over the examples,
    # all_reduced), dropout's masks and the scan all run on the local examples.
    c = check_bp(*setup(), BP, batch=B)
    # BatchNorm's new running statistics, computed from the whole (sharded) batch.
    assert_tree_close(c.result[4], c.expected[4])


@pytest.mark.slow
def test_zero3():
    check_zero3(*setup(), BP, batch=B)


@pytest.mark.slow
def test_megatron():
    check_megatron(*setup(), BP, MP, batch=B, specs={
        "params/Dense_0/kernel": P(None, "model"), "params/Dense_0/bias": P("model"),
        "params/CheckpointDense_0/kernel": P("model", None),
        "opt_state/0/mu/Dense_0/kernel": P(None, "model"),
        "opt_state/0/nu/CheckpointDense_0/kernel": P("model", None)})


@pytest.mark.slow
def test_dropout_inside_scan():
    # Dropout's random bits in the scanned body are drawn per device at its rows'
    # positions (their declaration's `apply` at the device's coordinate).
    check_bp(*setup(dropout_in_scan=True), BP, batch=B)


# Logical partitioning metadata: the kernels name their dimensions ("embed", "mlp"), the
# rules map "mlp" to the mesh's "model" axis, and flax derives the parameters' specs from
# that metadata; the hidden activation carries a logical constraint (on the model's own
# mesh, as a model written for GSPMD does), which `partir.ShardingConstraints` turns into
# the tiling of that value.
RULES = (("batch", "batch"), ("embed", None), ("mlp", "model"))
AUTO = jax.sharding.AxisType.Auto


class LogicalMLP(nn.Module):
    mesh: jax.sharding.Mesh

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        h = nn.Dense(H, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x)
        h = nn.with_logical_constraint(nn.relu(h), ("batch", "mlp"), mesh=self.mesh)
        return nn.Dense(C, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))(h)


@pytest.mark.slow
def test_logical_partitioning():
    model = LogicalMLP(jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AUTO, AUTO)))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    y = jnp.asarray(rng.integers(0, C, B), jnp.int32)
    boxed = model.init(jax.random.key(0), x)["params"]
    specs = nn.logical_to_mesh(nn.get_partition_spec(boxed), RULES)
    params = nn.meta.unbox(boxed)

    def step(params, x, y):
        def loss_fn(params):
            with nn.logical_axis_rules(RULES):
                logits = model.apply({"params": params}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return jax.value_and_grad(loss_fn)(params)

    assert specs["Dense_0"]["kernel"] == P(None, "model")
    # No BP tactic: the constraint on the activation puts the examples on "batch", and
    # propagation carries it back to the input.
    check_step(step, (params, x, y), BP4_MP2,
               [partir.ShardingConstraints(), ManualPartition.from_specs({"params": specs})],
               Expect(specs={"x": P("batch"), "params/Dense_0/kernel": P(None, "model"),
                             "params/Dense_0/bias": P("model"),
                             "params/Dense_1/kernel": P("model", None)},
                      grads_like="params", max_flops_ratio=0.25, batch=B))
