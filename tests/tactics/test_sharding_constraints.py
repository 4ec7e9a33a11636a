"""The model's own sharding annotations (`jax.lax.with_sharding_constraint`, flax's logical
constraints): the identity for the computation, ignored with one note per annotated line
by default, and applied as GSPMD's constraints by `partir.ShardingConstraints`."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from tests.oracles import check_oracles

BP8 = partir.Mesh({"batch": 8})
BATCH = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Auto,))
DATA_MODEL = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
X = jnp.asarray(np.random.default_rng(0).normal(size=(16, 4)), jnp.float32)
W = jnp.asarray(np.random.default_rng(1).normal(size=(4, 8)), jnp.float32)


def constrained(x):
    h = jax.lax.with_sharding_constraint(jnp.tanh(x), NamedSharding(BATCH, P("batch")))
    return h.sum()


ANNOTATED_LINE = constrained.__code__.co_firstlineno + 1


@pytest.mark.parametrize("schedule", [[], [partir.ManualPartition({"x": 0}, axis="batch")]],
                         ids=["empty", "BP"])
def test_an_annotation_is_the_identity_and_ignored_with_one_note(schedule):
    # Repro 2 of issue 27: the annotation was re-bound inside the shard_map.
    meta = check_oracles(constrained, BP8, schedule, X)
    assert "sharding_constraint" not in meta.hlo_ir
    (note,) = meta.notes
    assert f"test_sharding_constraints.py:{ANNOTATED_LINE}" in note and "ignored" in note
    # The gradient annotates the line twice (forward and backward): still one note.
    meta = check_oracles(jax.grad(constrained), BP8, schedule, X)
    (note,) = meta.notes
    assert "(2 values)" in note


def test_the_notes_show_in_the_cli_report_of_core_partition():
    result = partir.core_partition(constrained, BP8, [], X)
    assert len(result.notes) == 1
    result = partir.core_partition(constrained, BP8, [partir.ShardingConstraints()], X)
    assert result.notes == []


def test_sharding_constraints_tiles_the_annotated_value():
    meta = check_oracles(jax.grad(constrained), BP8, [partir.ShardingConstraints()], X)
    assert meta.notes == []
    assert meta.tactics[0].actions == [
        f'tile<%test_sharding_constraints.py:{ANNOTATED_LINE},0,"batch">'] * 2 + ["propagate"]
    assert meta.in_specs == (P("batch", None),) and meta.out_specs == (P("batch", None),)
    assert meta.collectives["all_gather"] == 0


def _mlp(mesh, spec):
    def f(x, w):
        h = jax.lax.with_sharding_constraint(jnp.tanh(x @ w), NamedSharding(mesh, spec))
        return h, jnp.sum(h * h)
    return f


def test_unused_axes_of_the_annotations_mesh_stay_replicated_as_jax_jit_places_them():
    f = _mlp(DATA_MODEL, P("data", None))
    meta = check_oracles(f, partir.Mesh({"data": 4, "model": 2}),
                         [partir.ShardingConstraints(),
                          partir.ManualPartition({"w": 1}, axis="model")], X, W)
    ref = jax.jit(f).lower(X, W).compile().output_shardings
    assert ref[0].spec == P("data")
    # The schedule's sharding of `h` (inputs first, then outputs): the later Megatron
    # tactic does not shard it on `model`. (The lowering then returns the all_gather's
    # operand, sharded on `model`: hlo.fusion.localize_results does not read `atomic`.)
    assert list(meta.tactics[-1].shardings.values())[2] == [["data"], []]
    assert 'atomic<%test_sharding_constraints.py' in " ".join(meta.tactics[0].actions)


def test_axes_the_annotations_mesh_lacks_are_left_to_later_tactics():
    # Annotated for data parallelism on a 1-D mesh, composed with Megatron on `model`.
    f = _mlp(BATCH, P("batch", None))
    meta = check_oracles(f, partir.Mesh({"batch": 4, "model": 2}),
                         [partir.ShardingConstraints(),
                          partir.ManualPartition({"w": 1}, axis="model")], X, W)
    assert meta.out_specs[0] == P("batch", "model")
    assert not any(a.startswith("atomic") for a in meta.tactics[0].actions)


def test_an_unconstrained_dimension_is_left_to_propagation():
    f = _mlp(DATA_MODEL, P("data", P.UNCONSTRAINED))
    meta = check_oracles(f, partir.Mesh({"data": 4, "model": 2}),
                         [partir.ShardingConstraints(),
                          partir.ManualPartition({"w": 1}, axis="model")], X, W)
    assert meta.out_specs[0] == P("data", "model")


def test_several_axes_of_a_dimension_tile_major_first():
    mlp = _mlp(DATA_MODEL, P(("model", "data"), None))

    def f(x, w):
        h, _ = mlp(x, w)
        return jnp.sin(h)  # not the annotated value itself: value_actions gives an output
        # read through an earlier tile no deep nest (see the report of issue 27)

    meta = check_oracles(f, partir.Mesh({"data": 4, "model": 2}),
                         [partir.ShardingConstraints()], X, W)
    assert meta.out_specs == (P(("model", "data"), None),)
    assert jax.jit(f).lower(X, W).compile().output_shardings.spec == P(("model", "data"))


def test_an_axis_the_schedules_mesh_lacks_is_an_error_naming_it_and_the_line():
    f = _mlp(DATA_MODEL, P("data", None))
    with pytest.raises(partir.AxisNotInMeshError, match="'data'") as e:
        partir.core_partition(f, BP8, [partir.ShardingConstraints()], X, W)
    assert e.value.loc.line == f.__code__.co_firstlineno + 1
    assert "test_sharding_constraints.py" in str(e.value)


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.with_logical_constraint(x, ("batch", "embed"))
        init = nn.initializers.lecun_normal()
        h = nn.Dense(16, use_bias=False,
                     kernel_init=nn.with_logical_partitioning(init, ("embed", "hidden")))(x)
        h = nn.with_logical_constraint(nn.relu(h), ("batch", "hidden"))
        y = nn.Dense(8, use_bias=False,
                     kernel_init=nn.with_logical_partitioning(init, ("hidden", "embed")))(h)
        return nn.with_logical_constraint(y, ("batch", "embed")), h


RULES = [("batch", "data"), ("hidden", "model"), ("embed", None)]


@pytest.mark.slow
def test_a_flax_model_with_logical_constraints_is_placed_as_jax_jit_places_it():
    model = _MLP()
    x = jnp.asarray(np.random.default_rng(2).normal(size=(16, 8)), jnp.float32)
    with jax.set_mesh(DATA_MODEL), nn.logical_axis_rules(RULES):
        params = jax.jit(model.init)(jax.random.key(0), x)

        def f(params, x):
            return model.apply(params, x)

        meta = check_oracles(f, partir.Mesh({"data": 4, "model": 2}),
                             [partir.ShardingConstraints()], params, x)
        compiled = jax.jit(f).lower(params, x).compile()
        declared = nn.logical_to_mesh(nn.get_partition_spec(params))
    # The outputs and the activation as constrained, as jax.jit places them.
    assert meta.out_specs == (P("data", None), P("data", "model"))
    assert [s.spec for s in compiled.output_shardings] == [P("data"), P("data", "model")]
    assert meta.in_specs[1] == P("data", None)
    assert compiled.input_shardings[0][1].spec == P("data")
    # The parameters as their own logical partitioning declares them (jax.jit takes
    # theirs from the arrays it is given, so has nothing to compare).
    assert _leaves(meta.in_specs[0]) == _leaves(declared) == [P(None, "model"), P("model")]
    # At the model's lines (not flax's): the three constraints and the two parameters'
    # logical partitionings, which flax also binds as constraints.
    sites = {a.split("%")[1].split(",")[0] for a in meta.tactics[0].actions[:-1]}
    assert len(sites) == 5
    assert all(site.startswith("test_sharding_constraints.py:") for site in sites)


def _leaves(specs) -> list[P]:
    return [_trimmed(s) for s in jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))]


def _trimmed(spec: P) -> P:
    """A spec without its trailing unsharded dims, as JAX prints the shardings it gives."""
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


class _Block(nn.Module):
    @nn.compact
    def __call__(self, h, _):
        h = jnp.tanh(nn.Dense(8)(h))
        return nn.with_logical_constraint(h, ("batch", "hidden")), None


class _Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
        h, _ = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True},
                       length=3)()(x, None)
        return jnp.mean(h ** 2)


@pytest.mark.slow
def test_an_annotation_inside_a_flax_scan_body_slices_the_scan():
    model = _Scanned()
    x = jnp.asarray(np.random.default_rng(3).normal(size=(16, 8)), jnp.float32)
    with jax.set_mesh(BATCH), nn.logical_axis_rules([("batch", "batch"), ("hidden", None)]):
        params = jax.jit(model.init)(jax.random.key(0), x)
        step = jax.grad(lambda p, x: model.apply(p, x), argnums=(0, 1))
        meta = check_oracles(step, BP8, [partir.ShardingConstraints()], params, x)
        unpartitioned = partir.partition(step, BP8, [], params, x)
        ref = jax.jit(step)(params, x)
    assert len(meta.tactics[0].actions) == 3  # the forward and the backward scan
    assert meta.out_specs[1] == P("batch", None) and ref[1].sharding.spec == P("batch")
    assert meta.collectives["all_gather"] == 0
    assert meta.cost.flops == pytest.approx(unpartitioned.cost.flops / 8, rel=0.05)
