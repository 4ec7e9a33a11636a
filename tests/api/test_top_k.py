"""`lax.top_k` along the last dimension partitioned on other dimensions (and, where the
partitioner must gather, on the top-k one): both oracles and the simulated cost."""

from __future__ import annotations

import numpy as np
import pytest
from jax import lax

import partir
from tests.oracles import check_oracles

MESH = partir.Mesh({"batch": 4, "model": 2})
rng = np.random.default_rng(0)
# distinct values: ties would make top_k's indices depend on the evaluation order
X = rng.permutation(8 * 4 * 16).astype(np.float32).reshape(8, 4, 16)
W = rng.normal(size=(16, 16)).astype(np.float32)


def scores_top_k(x, w):
    values, indices = lax.top_k(x @ w, 3)
    return values.sum(-1), indices


def top_k(x):
    return tuple(lax.top_k(x, 3))


SCHEDULES = {
    "BP": [partir.ManualPartition({"x": 0}, axis="batch", name="BP")],
    "BP+MP": [partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
              partir.ManualPartition({"x": 1}, axis="model", name="MP")],
}


def _check(fn, args, schedule):
    check_oracles(fn, MESH, schedule, *args)
    meta = partir.partition(fn, MESH, schedule, *args)
    assert meta.cost.unknown_ops == [] and meta.cost.flops > 0
    return meta


@pytest.mark.parametrize("name", SCHEDULES)
def test_top_k_on_other_dims_needs_no_communication(name):
    meta = _check(top_k, (X,), SCHEDULES[name])
    assert sum(meta.collectives.values()) == 0
    assert all(t.cost.unknown_ops == [] for t in meta.tactics)


def test_top_k_over_a_sharded_dimension_is_gathered():
    # MP splits w's columns, the dimension top_k selects along
    schedule = [*SCHEDULES["BP"], partir.ManualPartition({"w": 1}, axis="model", name="MP")]
    meta = _check(scores_top_k, (X, W), schedule)
    assert meta.collectives["all_gather"] >= 1
