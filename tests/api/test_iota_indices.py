"""Gathers and scatters whose index columns count along a batch dimension of the indices
(`x[jnp.arange(n), y]`, `.at[jnp.arange(n)[:, None], idx].set(u)`, `put_along_axis`):
the frontend writes such a column as a batching dimension (`rules/indexing`
`gather_canonical`, `scatter_canonical`), so that a batch sharding of the indices reaches
the operand instead of gathering it. Both oracles, and what the program communicates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from tests.oracles import check_oracles

B, V = 8, 12
MESH = partir.Mesh({"batch": 4, "model": 2})
BP = partir.ManualPartition({"x": 0}, axis="batch")


def _x() -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).normal(size=(B, V)), jnp.float32)


def _labels(low: int = 0, high: int = V) -> jax.Array:
    return jnp.asarray(np.random.default_rng(1).integers(low, high, (B,)), jnp.int32)


def _conflicts(meta) -> list:
    return [c for t in meta.tactics for c in t.conflicts]


def test_a_cross_entropys_picked_log_probabilities_keep_the_batch_sharded():
    def step(x, y):
        return jax.value_and_grad(
            lambda x: -jax.nn.log_softmax(x)[jnp.arange(B), y].mean())(x)

    meta = check_oracles(step, MESH, [partir.ManualPartition({"x": 0, "y": 0},
                                                             axis="batch")], _x(), _labels())
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir
    assert not _conflicts(meta), _conflicts(meta)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["at_set", "at_add", "at_max", "put_along_axis"])
def test_a_scatter_back_into_each_rows_order_keeps_the_batch_sharded(how):
    """Top-p filtering writes each row's filtered values back through its argsort."""
    def f(x):
        idx = jnp.argsort(x, axis=-1)
        sorted_ = jnp.take_along_axis(x, idx, axis=-1) * 2.0
        zeros = jnp.zeros_like(x)
        rows = jnp.arange(B)[:, None]
        if how == "at_set":
            return zeros.at[rows, idx].set(sorted_)
        if how == "at_add":
            return zeros.at[rows, idx].add(sorted_)
        if how == "at_max":
            return zeros.at[rows, idx].max(sorted_)
        return jnp.put_along_axis(zeros, idx, sorted_, axis=-1, inplace=False)

    meta = check_oracles(f, MESH, [BP], _x())
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir
    assert not _conflicts(meta), _conflicts(meta)


@pytest.mark.parametrize("mode", ["fill", "clip"])
def test_out_of_bounds_labels_beside_the_counting_column(mode):
    """The counting column is always in bounds; the other column's out-of-bounds labels
    are filled or clipped as before, on every device."""
    def f(x, y):
        return x.at[jnp.arange(B), y].get(mode=mode, fill_value=-3.0)

    meta = check_oracles(f, MESH, [partir.ManualPartition({"x": 0, "y": 0}, axis="batch")],
                         _x(), _labels(-V - 3, V + 3))
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir


def test_a_counting_column_on_the_second_batch_dim_of_the_indices():
    """rows [8, 3] with the column counting along dim 0 of [8, 3, 2] indices."""
    def f(x, y):
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, 3))
        return x[rows, y]

    y = jnp.asarray(np.random.default_rng(2).integers(0, V, (B, 3)), jnp.int32)
    meta = check_oracles(f, MESH, [partir.ManualPartition({"x": 0, "y": 0}, axis="batch")],
                         _x(), y)
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir


@pytest.mark.parametrize("rows", [
    pytest.param(lambda: jnp.arange(B)[::-1], id="reversed"),
    pytest.param(lambda: jnp.arange(B) // 2, id="halved"),
    pytest.param(lambda: jnp.arange(B) + 1, id="shifted"),
])
def test_columns_that_do_not_count_from_zero_stay_indices(rows):
    """Only 0, 1, 2, ... along a dimension is a batching dimension: anything else keeps
    its meaning as an index (and is still partitioned correctly)."""
    def f(x, y):
        return x.at[rows(), y].get(mode="fill", fill_value=0.0)

    check_oracles(f, MESH, [partir.ManualPartition({"x": 0, "y": 0}, axis="batch")], _x(),
                  _labels())


def test_a_counting_column_shorter_than_the_operand_dim_stays_an_index():
    def f(x, y):
        return x[jnp.arange(4), y[:4]]

    check_oracles(f, MESH, [partir.ManualPartition({"x": 0, "y": 0}, axis="batch")], _x(),
                  _labels())


def test_a_counting_column_in_a_scan_body():
    """The canonical form is made as ops are emitted, in a body's region too."""
    def f(x, y):
        def body(c, xy):
            x, y = xy
            return c + jax.nn.log_softmax(x)[jnp.arange(B), y].sum(), None
        return jax.lax.scan(body, 0.0, (x, y))[0]

    xs = jnp.stack([_x(), _x() * 2])
    ys = jnp.stack([_labels(), _labels()[::-1]])
    meta = check_oracles(f, MESH, [partir.ManualPartition({"x": 1, "y": 1}, axis="batch")],
                         xs, ys)
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir


def test_a_counting_column_beside_two_index_columns():
    """The columns left are concatenated again: x[arange, y, z] of a [B, V, 4] operand."""
    def f(x, y, z):
        return x[jnp.arange(B), y, z]

    x = jnp.asarray(np.random.default_rng(3).normal(size=(B, V, 4)), jnp.float32)
    z = jnp.asarray(np.random.default_rng(4).integers(0, 4, (B,)), jnp.int32)
    meta = check_oracles(f, MESH, [partir.ManualPartition({"x": 0, "y": 0, "z": 0},
                                                          axis="batch")], x, _labels(), z)
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir
    assert not _conflicts(meta), _conflicts(meta)
