"""Tactics name outputs as they name inputs (`out`, `out/0`, `out/1/w`:
partir/frontend/names.py), and `out_shardings` (partir.jit, partir.partition) returns each
output with exactly its PartitionSpec's sharding, as one more tactic after the schedule
(issue 27, item 3 and repro 4)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from partir import FIRST_DIVISIBLE_DIM, ManualPartition
from tests.oracles import assert_same, check_oracles

BP8 = partir.Mesh({"batch": 8})
Z3 = ManualPartition({"w": FIRST_DIVISIBLE_DIM}, axis="batch")


def bp(**dims):
    return ManualPartition(dims, axis="batch")


def step(w, x):
    return jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)


def _args():
    rng = np.random.RandomState(0)
    return (jnp.asarray(rng.randn(16, 8), jnp.float32),
            jnp.asarray(rng.randn(32, 16), jnp.float32))


def _has_spec(array, spec):
    return isinstance(array.sharding, NamedSharding) and array.sharding.is_equivalent_to(
        NamedSharding(array.sharding.mesh, spec), array.ndim)


@pytest.mark.slow
def test_zero3_gradient_named_as_an_output_is_reduce_scattered_like_its_parameter():
    w, x = _args()
    before = check_oracles(step, BP8, [bp(x=0), Z3], w, x)
    assert before.out_specs[1] == P(None, None)
    assert before.collectives["reduce_scatter"] == 0
    assert before.collectives["all_reduce"] == 2

    meta = check_oracles(step, BP8, [bp(x=0), Z3, bp(**{"out/1": FIRST_DIVISIBLE_DIM})], w, x)
    assert meta.tactics[-1].actions == ['tile<%out/1,0,"batch">', "propagate"]
    assert meta.out_specs[1] == meta.in_specs[0] == P("batch", None)
    assert meta.collectives["reduce_scatter"] >= 1
    assert meta.collectives["all_reduce"] == 1  # the loss's; the gradient's is scattered
    assert meta.tactics[-1].shardings["out/1"] == [["batch"], []]


def test_out_shardings_returns_the_zero3_gradient_sharded_like_its_parameter():
    w, x = _args()
    meta = check_oracles(step, BP8, [bp(x=0), Z3], w, x, out_shardings=(None, P("batch")))
    assert meta.tactics[-1].name == "out_shardings"
    assert meta.tactics[-1].actions == ['tile<%out/1,0,"batch">', "propagate"]
    assert meta.out_specs == (P(), P("batch", None))
    assert meta.collectives["reduce_scatter"] >= 1
    jitted, _ = partir.jit(step, BP8, [bp(x=0), Z3], out_shardings=(None, P("batch")))
    loss, grad = jitted(w, x)
    assert _has_spec(grad, P("batch")) and _has_spec(loss, P())


def test_partition_takes_out_shardings_as_jit_does():
    w, x = _args()
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
    meta = partir.partition(step, BP8, [bp(x=0), Z3], *shapes, out_shardings=(None, P("batch")))
    jitted, jit_meta = partir.jit(step, BP8, [bp(x=0), Z3], out_shardings=(None, P("batch")))
    jitted(w, x)
    assert meta.out_specs == jit_meta.out_specs == (P(), P("batch", None))
    assert [t.actions for t in meta.tactics] == [t.actions for t in jit_meta.tactics]
    assert meta.collectives == jit_meta.collectives


def test_axes_the_spec_does_not_name_come_back_gathered():
    x = jnp.arange(128.0).reshape(16, 8)
    # Propagation leaves tanh's result sharded on batch; P() asks for it replicated.
    meta = check_oracles(jnp.tanh, BP8, [bp(x=0)], x, out_shardings=P())
    assert meta.out_specs == (P(None, None),)
    assert meta.collectives["all_gather"] == 1
    assert meta.tactics[-1].shardings["out"] == [[], []]
    jitted, _ = partir.jit(jnp.tanh, BP8, [bp(x=0)], out_shardings=P())
    assert _has_spec(jitted(x), P())
    # ... and on another dimension: one all_to_all, no gather.
    meta = check_oracles(jnp.tanh, BP8, [bp(x=0)], x, out_shardings=P(None, "batch"))
    assert meta.out_specs == (P(None, "batch"),)
    assert meta.collectives["all_to_all"] == 1 and meta.collectives["all_gather"] == 0


def test_only_the_axes_the_spec_does_not_name_are_gathered():
    mesh = partir.Mesh({"batch": 4, "model": 2})
    x = jnp.arange(128.0).reshape(16, 8)
    schedule = [bp(x=0), ManualPartition({"x": 0}, axis="model")]
    meta = check_oracles(jnp.tanh, mesh, schedule, x)
    assert meta.out_specs == (P(("batch", "model"), None),)
    meta = check_oracles(jnp.tanh, mesh, schedule, x, out_shardings=P("batch"))
    assert meta.out_specs == (P("batch", None),)
    assert meta.collectives["all_gather"] == 1
    jitted, _ = partir.jit(jnp.tanh, mesh, schedule, out_shardings=P("batch"))
    y = jitted(x)
    assert _has_spec(y, P("batch"))
    # each device holds its batch tile whole: the gather was over `model` only
    assert {s.data.shape for s in y.addressable_shards} == {(4, 8)}


def test_an_input_returned_as_it_is_keeps_its_tiling():
    def f(w, x):
        return w, (x @ w).sum()

    w, x = _args()
    meta = check_oracles(f, BP8, [bp(x=0), Z3], w, x, out_shardings=(P("batch"), None))
    assert meta.tactics[-1].actions == ["propagate"]  # already tiled so: nothing to issue
    assert meta.out_specs[0] == P("batch", None)


def test_a_prefix_key_selects_every_output_under_it():
    w, x = _args()
    meta = check_oracles(step, BP8, [bp(x=0), Z3, bp(out=FIRST_DIVISIBLE_DIM)], w, x)
    assert meta.tactics[-1].actions == ['tile<%out/1,0,"batch">', "propagate"]
    assert any("out/0 []: no unsharded dimension" in n for n in meta.tactics[-1].notes)


def test_a_parameter_named_out_moves_the_output_root():
    def f(out, x):
        return out * x

    a = jnp.arange(16.0)
    meta = check_oracles(f, BP8, [bp(out=0)], a, a)
    assert meta.tactics[0].actions == ['tile<%out,0,"batch">', "propagate"]
    assert set(meta.tactics[0].shardings) == {"out", "x", "out_"}
    meta = check_oracles(f, BP8, [bp(out_=0)], a, a)
    assert meta.tactics[0].actions == ['tile<%out_,0,"batch">', "propagate"]
    assert meta.in_specs == (P("batch"), P("batch"))


@pytest.mark.parametrize("out_shardings, words", [
    ((P(), P(), P()), "pytree prefix of the function's outputs"),
    ((None, P("model")), "'model'"),
    ((None, P("batch", None, None)), "has 3 entries, but the output has rank 2"),
    ((None, P("batch", "batch")), "names axis 'batch' twice"),
])
def test_bad_out_shardings_are_named(out_shardings, words):
    w, x = _args()
    jitted, _ = partir.jit(step, BP8, [bp(x=0)], out_shardings=out_shardings)
    with pytest.raises(partir.PartitionError) as e:
        jitted(w, x)
    assert words in str(e.value)


def test_a_sharding_instead_of_a_spec_is_refused_when_jit_is_called():
    mesh = jax.make_mesh((8,), ("batch",))
    with pytest.raises(partir.PartitionError) as e:
        partir.jit(step, BP8, [bp(x=0)], out_shardings=(None, NamedSharding(mesh, P())))
    assert "out_shardings at [1]: expected a jax.sharding.PartitionSpec" in str(e.value)
    assert "pass its .spec" in str(e.value)


def test_an_unknown_output_name_lists_the_outputs():
    w, x = _args()
    with pytest.raises(partir.UnknownInputError) as e:
        partir.core_partition(step, BP8, [bp(**{"out/2": 0})], w, x)
    assert "no input, output or tag named 'out/2'" in str(e.value)
    assert "out" in str(e.value).split("(inputs, outputs and tags: ")[1]


@pytest.mark.slow
def test_a_differentiated_call_with_out_shardings_is_jaxs_derivative():
    w, x = _args()
    jitted, _ = partir.jit(step, BP8, [bp(x=0), Z3], out_shardings=(None, P("batch")))

    def loss(w):
        return jitted(w, x)[0]

    assert_same(jax.grad(loss)(w), jax.grad(lambda w: step(w, x)[0])(w), "grad")


def test_automatic_partition_leaves_the_outputs_to_the_caller():
    w, x = _args()
    search = partir.AutomaticPartition(axis="batch", inputs=["out"], max_evaluations=1)
    with pytest.raises(partir.InvalidTacticError) as e:
        partir.core_partition(step, BP8, [search], w, x)
    assert "'out' selects outputs only" in str(e.value)
