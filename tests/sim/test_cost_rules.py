"""Cost rules cover every primitive the partitioner handles, and never break simulation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import partir
from partir.core.program import IDENTITY_KINDS
from partir.core.tmr import REGISTRY
from partir.hlo.ops import AXIS_INDEX, COLLECTIVES
from partir.pipeline import lower
from partir.rules import CATALOGUE
from partir.sim import COST_RULES, CostRule, simulate
from partir.sim.cost import THREEFRY_OPS

S = jax.ShapeDtypeStruct


def _hlo(fn, *args, mesh=None, schedule=()):
    return lower(partir.core_partition(fn, mesh or {"a": 2}, list(schedule), *args)
                 .program).hlo


def test_every_tmr_primitive_and_hlo_op_has_a_cost_rule():
    # tile/atomic are Core value actions: materialization removes them before lowering.
    partitioned = set(REGISTRY) - set(IDENTITY_KINDS)
    hlo_ops = {*COLLECTIVES, AXIS_INDEX}
    assert sorted((partitioned | hlo_ops) - set(COST_RULES)) == []


def test_a_failing_rule_is_reported_not_raised(monkeypatch):
    def broken(op, size):
        raise KeyError("dimension")

    monkeypatch.setitem(COST_RULES, "tanh", CostRule(CATALOGUE["tanh"], broken))
    h = _hlo(lambda x: jnp.tanh(x) @ x, S((8, 8), jnp.float32))
    cost = simulate(h)
    assert cost.unknown_ops == ["tanh"]
    assert cost.flops == 2 * 8 * 8 * 8  # the matmul's, none from the failed rule


def test_an_unknown_primitive_is_reported(monkeypatch):
    monkeypatch.delitem(COST_RULES, "tanh")
    assert simulate(_hlo(jnp.tanh, S((8,), jnp.float32))).unknown_ops == ["tanh"]


@pytest.mark.parametrize("k,comparisons", [(1, 1), (4, 2)])
def test_top_k_flops(k, comparisons):
    h = _hlo(lambda x: lax.top_k(x, k)[0], S((6, 16), jnp.float32))
    cost = simulate(h)
    assert cost.unknown_ops == []
    assert cost.flops == 6 * 16 * comparisons


def test_random_bits_cost_one_hash_per_word():
    h = _hlo(lambda key: jax.random.bits(key, (8, 4)), jax.random.key(0))
    cost = simulate(h)
    assert cost.unknown_ops == []
    assert cost.flops == THREEFRY_OPS * 8 * 4
