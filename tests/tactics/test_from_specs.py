"""`partir.ManualPartition.from_specs`: inputs tiled as PartitionSpecs say, given as a
pytree shaped like the positional arguments or a dict of input name -> spec(s)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import partir
from tests.oracles import check_oracles

MESH = partir.Mesh({"data": 4, "model": 2})
X = jnp.asarray(np.random.default_rng(0).normal(size=(16, 8)), jnp.float32)


class _Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        h = nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
        return jnp.mean(jnp.tanh(h) ** 2)


def _linen():
    model = _Dense()
    boxed = model.init(jax.random.key(0), X)
    specs = nn.logical_to_mesh(nn.get_partition_spec(boxed), [("embed", None),
                                                              ("mlp", "model")])
    return model, nn.meta.unbox(boxed), specs


@pytest.mark.slow
def test_a_pytree_of_specs_like_the_arguments_shards_the_inputs_as_jax_would():
    model, params, specs = _linen()

    def step(params, x):
        return jax.grad(model.apply)(params, x)

    tactic = partir.ManualPartition.from_specs((specs, P("data")))
    assert tactic.axis_label == "model,data" and tactic.label == "ManualPartition.from_specs"
    meta = check_oracles(step, MESH, [tactic], params, X)
    assert meta.in_specs[0]["params"]["Dense_0"]["kernel"] == P(None, "model")
    assert meta.in_specs[1] == P("data", None)
    assert meta.tactics[0].actions == ['tile<%params/params/Dense_0/kernel,1,"model">',
                                       'tile<%x,0,"data">', "propagate"]
    # The gradient is sharded like its parameter.
    assert meta.out_specs[0]["params"]["Dense_0"]["kernel"] == P(None, "model")


def test_a_dict_of_names_is_a_prefix_and_takes_spec_pytrees():
    model, params, specs = _linen()

    def step(params, x):
        return jax.grad(model.apply)(params, x)

    by_name = partir.ManualPartition.from_specs({"params": specs, "x": P("data")})
    by_tree = partir.ManualPartition.from_specs((specs, P("data")))
    a = partir.partition(step, MESH, [by_name], params, X)
    b = partir.partition(step, MESH, [by_tree], params, X)
    assert a.in_specs == b.in_specs and a.tactics[0].actions == b.tactics[0].actions
    # A name applies to every input under it.
    prefix = partir.partition(step, MESH, [partir.ManualPartition.from_specs(
        {"params/params/Dense_0/kernel": P(None, "model")})], params, X)
    assert prefix.in_specs[0]["params"]["Dense_0"]["kernel"] == P(None, "model")


def test_one_dimension_on_several_axes_is_tiled_major_first_as_a_manual_partition_would():
    f = lambda x: jnp.sin(x) * 2  # noqa: E731
    meta = check_oracles(f, MESH, [partir.ManualPartition.from_specs(
        (P(("model", "data")),))], X)
    manual = partir.partition(f, MESH, [partir.ManualPartition({"x": 0}, axis="model"),
                                        partir.ManualPartition({"x": 0}, axis="data")], X)
    assert meta.in_specs == manual.in_specs == (P(("model", "data"), None),)
    assert meta.out_specs == manual.out_specs


@pytest.mark.slow
def test_nnx_partition_specs_name_the_state():
    class Model(nnx.Module):
        def __init__(self, rngs):
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
            self.linear = nnx.Linear(8, 16, kernel_init=init, rngs=rngs)

        def __call__(self, x):
            return self.linear(x)

    jax_mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    with jax.set_mesh(jax_mesh):  # where nnx places partitioned variables it creates
        graph, state = nnx.split(Model(nnx.Rngs(0)))

    def f(state, x):
        return jnp.sum(nnx.merge(graph, state)(x) ** 2)

    specs = nnx.get_partition_spec(state)
    meta = check_oracles(f, MESH, [partir.ManualPartition.from_specs(
        {"state": specs, "x": P("data")})], state, X)
    assert 'tile<%state/linear/kernel/value,1,"model">' in meta.tactics[0].actions


def test_unknown_names_and_specs_longer_than_the_value_are_errors():
    f = lambda x: jnp.sin(x)  # noqa: E731
    with pytest.raises(partir.UnknownInputError, match="did you mean 'x'"):
        partir.partition(f, MESH, [partir.ManualPartition.from_specs({"xx": P("data")})], X)
    with pytest.raises(partir.DimensionOutOfRangeError, match=r"2 dimensions.*3 entries"):
        partir.partition(f, MESH, [partir.ManualPartition.from_specs(
            {"x": P("data", None, "model")})], X)
    with pytest.raises(partir.AxisNotInMeshError, match="'batch'"):
        partir.partition(f, MESH, [partir.ManualPartition.from_specs({"x": P("batch")})], X)
    with pytest.raises(partir.InvalidTacticError, match="not a prefix"):
        partir.partition(f, MESH, [partir.ManualPartition.from_specs(
            (P("data"), P("data")))], X)
    with pytest.raises(partir.InvalidTacticError, match="PartitionSpecs"):
        partir.ManualPartition.from_specs({"x": 0})
