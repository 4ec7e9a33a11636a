"""Shardings a schedule asks for hold whatever the program does with the values
(issue 27): a result the collectives make sharded is returned sharded, and an input the
function never reads is laid out as asked."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import partir
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

