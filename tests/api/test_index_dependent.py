"""Index-dependent local computations are explicit IR: where a tile needs its position,
materialization emits `index` (the loop's iteration number) and ordinary primitives for
the offset, which lower to `axis_index` and run on every evaluator like any other op.

Each program is checked against both oracles (the sequential Core interpreter and the
executed program on 8 devices equal the unpartitioned function)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from tests.oracles import check_oracles

MESH = partir.Mesh({"batch": 4, "model": 2})
rng = np.random.default_rng(0)


def _check(fn, args, schedule):
    return check_oracles(fn, MESH, schedule, *args)


def _loop_body(core_ir: str) -> list[str]:
    """The lines of the first loop's body, without the loop's own lines."""
    lines = core_ir.splitlines()
    start = next(i for i, line in enumerate(lines) if " loop " in line)
    end = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("yield"))
    return [line.strip() for line in lines[start + 1:end]]


def counting_rows(x):
    return x + lax.broadcasted_iota(jnp.float32, x.shape, 0)


def test_iota_tiled_along_its_counting_dim_shows_index_and_offset():
    x = rng.normal(size=(16, 8)).astype(np.float32)
    meta = _check(counting_rows, (x,), [partir.ManualPartition({"x": 0}, axis="batch")])
    assert _loop_body(meta.core_ir) == [
        "%ibatch = index %rbatch : tensor<i32>",
        "%iota = iota() {dimension=0, dtype=float32, shape=[4, 8]} : tensor<4x8xf32>",
        "%constant = constant 4 : tensor<i32>",
        "%mul = mul(%ibatch, %constant) : tensor<i32>",
        "%convert_element_type = convert_element_type(%mul) {new_dtype=float32, "
        "weak_type=False} : tensor<f32>",
        "%1 = add(%iota, %convert_element_type) : tensor<4x8xf32>",
        "%2 = slice 0 %x[%rbatch] : tensor<4x8xf32>",
        "%3 = add(%2, %1) : tensor<4x8xf32>",
    ]
    assert '%ibatch = index %rbatch : tensor<i32>' in meta.spmd_ir
    assert '%ibatch = axis_index "batch" : tensor<i32>' in meta.hlo_ir
    assert "range" not in meta.hlo_ir


def test_iota_not_tiled_along_its_counting_dim_is_the_single_op():
    x = rng.normal(size=(16, 8)).astype(np.float32)
    meta = _check(counting_rows, (x,), [partir.ManualPartition({"x": 1}, axis="model")])
    body = _loop_body(meta.core_ir)
    assert "%1 = iota() {dimension=0, dtype=float32, shape=[16, 4]} : tensor<16x4xf32>" in body
    assert not any("index" in line for line in body)
    assert "axis_index" not in meta.hlo_ir


def two_level_iota(x):
    # counting along a dimension tiled by two nested loops: offset (i_b * 2 + i_m) * 2
    return x * lax.broadcasted_iota(jnp.int32, x.shape, 0)


def test_iota_under_two_loops():
    x = rng.integers(0, 9, size=(16, 4)).astype(np.int32)
    schedule = [partir.ManualPartition({"x": 0}, axis="batch"),
                partir.ManualPartition({"x": 0}, axis="model")]
    meta = _check(two_level_iota, (x,), schedule)
    assert "%ibatch = index %rbatch" in meta.core_ir
    assert "%imodel = index %rmodel" in meta.core_ir


def embed(table, ids):
    return table[ids]


@pytest.mark.parametrize("mode", [None, "clip", "fill"])
def test_gather_from_a_sliced_table(mode):
    """The rows of the table are tiled over `model`: each device gathers the ids that fall
    in its rows (an offset from its index) and the partial rows are summed."""
    table = rng.normal(size=(16, 6)).astype(np.float32)
    ids = np.array([[0, 5, 15, 8], [3, 3, 12, 17], [-1, 9, 2, 7], [14, 1, 0, 6]], np.int32)

    def fn(table, ids):
        if mode is None:
            return embed(table, jnp.clip(ids, 0, 15))
        return table.at[ids].get(mode=mode)

    schedule = [partir.ManualPartition({"table": 0}, axis="model"),
                partir.ManualPartition({"ids": 0}, axis="batch")]
    meta = _check(fn, (table, ids), schedule)
    assert "%imodel = index %rmodel" in meta.core_ir
    assert 'axis_index "model"' in meta.hlo_ir


def noise(x, key):
    return x + jax.random.normal(key, x.shape)


@pytest.mark.parametrize("impl", [jax.random.key, jax.random.PRNGKey])
def test_random_bits_tiled_along_drawn_dims(impl):
    """The bits of a single key drawn for an array tiled on both dimensions: each device
    hashes the global linear positions of its tile."""
    x = rng.normal(size=(16, 8)).astype(np.float32)
    schedule = [partir.ManualPartition({"x": 0}, axis="batch"),
                partir.ManualPartition({"x": 1}, axis="model")]
    meta = _check(noise, (x, impl(5)), schedule)
    assert "%ibatch = index %rbatch" in meta.core_ir
    assert "%imodel = index %rmodel" in meta.core_ir
    assert "random_bits" not in meta.hlo_ir  # threefry of the positions, computed locally
