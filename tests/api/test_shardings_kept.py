"""Shardings a schedule asks for hold whatever the program does with the values
(issue 27): a result the collectives make sharded is returned sharded, and an input the
function never reads is laid out as asked."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from partir.core.materialize import materialize
from partir.hlo import interpret_hlo, lower_spmd_to_hlo, optimize, verify_hlo
from partir.spmd import lower_core_to_spmd
from tests.oracles import check_oracles


def _megatron_step(w, x):
    # How equinox's and haiku's Linear compute under vmap: the weight is (out, in).
    return jax.value_and_grad(
        lambda w: jnp.mean(jnp.tanh(jnp.einsum("bi,oi->bo", x, w)) ** 2))(w)


def test_a_megatron_weight_gradient_is_reduced_then_returned_sharded():
    mesh = partir.Mesh({"batch": 4, "model": 2})
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(32, 16)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
    schedule = [partir.ManualPartition({"x": 0}, axis="batch"),
                partir.ManualPartition({"w": 0}, axis="model")]
    meta = check_oracles(_megatron_step, mesh, schedule, w, x)
    assert meta.out_specs == (P(), P("model", None))
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir
    # The batch reduction moves the model-local gradient, not the gathered weight.
    assert re.search(r'all_reduce <"batch"> %\d+ : tensor<16x16xf32>', meta.hlo_ir), \
        meta.hlo_ir
    assert meta.cost.bytes_moved["all_gather"] == 0


def _ignores_avg(x, avg):
    # haiku's EMA `average` state: an input the step never reads.
    return jnp.tanh(x).sum()


def _hlo_oracle(fn, mesh, schedule, *args):
    """The lowered and the optimized PartIR:HLO programs on the simulated mesh, both
    equal to fn; the optimized one."""
    cp = partir.core_partition(fn, mesh, schedule, *args)
    hlo = lower_spmd_to_hlo(lower_core_to_spmd(materialize(cp.program), cp.program.mesh))
    opt = optimize(hlo)
    for program in (hlo, opt):
        verify_hlo(program, check_primitives=True)
        (got,) = interpret_hlo(program, *args)
        np.testing.assert_allclose(got, fn(*args), rtol=1e-5)
    return opt


def test_an_input_never_read_keeps_its_requested_sharding():
    mesh = partir.Mesh({"batch": 8})
    x = jnp.ones((16, 4))
    avg = jnp.arange(64.0).reshape(16, 4)
    schedule = [partir.ManualPartition({"x": 0, "avg": 0}, axis="batch")]
    meta = check_oracles(_ignores_avg, mesh, schedule, x, avg)
    assert meta.in_specs == (P("batch", None), P("batch", None))
    assert meta.tactics[0].shardings["avg"] == [["batch"], []]
    opt = _hlo_oracle(_ignores_avg, mesh, schedule, x, avg)
    assert opt.attributes["in_shardings"][1] == (("batch",), ())
    assert opt.args[1].type.shape == (2, 4)
    # Placement: the executable takes avg sharded; one that arrives replicated is laid
    # out so, one that arrives sharded passes through.
    jitted, _ = partir.jit(_ignores_avg, mesh, schedule, keep_unused=True)
    compiled = jitted.lower(x, avg).compile()
    assert [s.spec for s in compiled.input_shardings[0]] == [P("batch", None)] * 2
    jax_mesh = jax.make_mesh((8,), ("batch",))
    for placed in (avg, jax.device_put(avg, NamedSharding(jax_mesh, P("batch")))):
        np.testing.assert_allclose(jitted(x, placed), _ignores_avg(x, avg), rtol=1e-6)


def test_an_input_never_read_is_sharded_by_each_tactic_in_turn():
    """ZeRO-3 after batch parallelism: the second tactic's tiling refines the first's on
    an input nothing reads, as on one that is read."""
    mesh = partir.Mesh({"batch": 4, "model": 2})
    x = jnp.ones((16, 4))
    avg = jnp.arange(64.0).reshape(16, 4)
    schedule = [partir.ManualPartition({"x": 0, "avg": 0}, axis="batch"),
                partir.ManualPartition({"avg": 1}, axis="model")]
    meta = check_oracles(_ignores_avg, mesh, schedule, x, avg)
    assert meta.in_specs == (P("batch", None), P("batch", "model"))
    assert meta.tactics[1].shardings["avg"] == [["batch"], ["model"]]
    opt = _hlo_oracle(_ignores_avg, mesh, schedule, x, avg)
    assert opt.args[1].type.shape == (4, 2)


def test_an_input_never_read_is_padded_where_the_axis_does_not_divide_it():
    mesh = partir.Mesh({"batch": 8})
    x = jnp.ones((16, 4))
    avg = jnp.arange(20.0).reshape(5, 4)
    schedule = [partir.ManualPartition({"x": 0, "avg": 0}, axis="batch", pad=True)]
    meta = check_oracles(_ignores_avg, mesh, schedule, x, avg)
    assert meta.in_specs == (P("batch", None), P("batch", None))
    _hlo_oracle(_ignores_avg, mesh, schedule, x, avg)


def test_a_value_named_for_a_remat_policy_keeps_its_sharding():
    """`checkpoint_name` (JAX's `name` primitive) is the identity: a batch sharding and a
    partial sum pass through it, under `jax.checkpoint` with a policy saving the named
    value. It stopped propagation before, and the batch was gathered."""
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_only_these_names("h")

    def step(w1, w2, x):
        def block(x):
            return jnp.tanh(checkpoint_name(x @ w1, "h")) @ w2
        return jax.value_and_grad(
            lambda x: jnp.mean(jax.checkpoint(block, policy=policy)(x) ** 2))(x)

    rng = np.random.default_rng(0)
    w1, w2 = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((16, 24), (24, 16)))
    x = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
    mesh = partir.Mesh({"batch": 4, "model": 2})
    bp = partir.ManualPartition({"x": 0}, axis="batch")
    meta = check_oracles(step, mesh, [bp], w1, w2, x)
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir
    assert not [c for t in meta.tactics for c in t.conflicts], meta.tactics
    # The named value is a partial sum over "model" when w1's contracting dim is sliced:
    # one all_reduce after it, as without the name.
    mp = partir.ManualPartition({"w1": 0}, axis="model")
    meta = check_oracles(lambda w1, x: checkpoint_name(x @ w1, "h") * 2.0, mesh, [bp, mp],
                         w1, x)
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir
    assert meta.collectives["all_reduce"] == 1, meta.hlo_ir
