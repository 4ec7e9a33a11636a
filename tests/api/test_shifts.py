"""Rolls and shifts of a sliced dimension move tiles between neighbouring devices with
collective_permutes (`permute_shifted_tiles` in partir/hlo/fusion.py) instead of gathering
the dimension: on both oracles and the HLO interpreter, equal to the function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partir
from partir.hlo import interpret_hlo
from partir.pipeline import lower
from tests.budget import examples
from tests.oracles import assert_same, check_oracles

MESH = partir.Mesh({"a": 4, "b": 2})


def _tiled_on(axes, dim=0):
    return [partir.ManualPartition({"x": dim}, axis=a) for a in axes]


def _check(fn, axes, x, dim=0):
    """Both oracles, the HLO interpreter; returns the metadata."""
    meta = check_oracles(fn, MESH, _tiled_on(axes, dim), x)
    hlo = lower(partir.core_partition(fn, MESH, _tiled_on(axes, dim), x).program).hlo
    assert_same(interpret_hlo(hlo, x)[0], fn(x), "HLO interpreter")
    return meta


def _permutes(shift: int, n: int, devices: int) -> int:
    """The collective_permutes of a roll by `shift` of n rows in chunks over `devices`:
    one per chunk a tile takes rows from, but its own."""
    q, r = divmod(shift % n, n // devices)
    return sum(distance % devices != 0 for distance in ((q, q + 1) if r else (q,)))


@pytest.mark.parametrize("shift, axes", [
    (1, ("a",)), (5, ("a",)), (-3, ("a", "b")), (5, ("a", "b")), (3, ("b",)),
    (8, ("a",)), (17, ("a",)),
])
def test_a_roll_of_a_sliced_dimension_permutes_its_tiles(shift, axes):
    def f(x):
        return jnp.sin(jnp.roll(jnp.cos(x), shift, axis=0)) * x

    x = jnp.arange(64.0).reshape(16, 4)
    meta = _check(f, axes, x)
    devices = int(np.prod([MESH[a] for a in axes]))
    assert meta.collectives["all_gather"] == 0
    assert meta.collectives["collective_permute"] == _permutes(shift, 16, devices)
    assert meta.cost.bytes_moved["collective_permute"] > 0


def test_a_roll_along_the_second_dimension():
    def f(x):
        return jnp.roll(x, 3, axis=1) + x

    x = jnp.arange(64.0).reshape(4, 16)
    meta = _check(f, ("a",), x, dim=1)
    assert meta.collectives["all_gather"] == 0
    assert meta.collectives["collective_permute"] == _permutes(3, 16, 4) == 1


def test_pieces_laid_out_differently_on_each_device_are_gathered():
    """[x[0:3], x[5:16], x[3:5]]: device 0's tile comes from two chunks, device 3's from
    one, so no permute of the same pieces serves them all."""
    def f(x):
        return jnp.concatenate([x[0:3], x[5:16], x[3:5]]) * x

    x = jnp.arange(64.0).reshape(16, 4)
    meta = _check(f, ("a",), x)
    assert meta.collectives["collective_permute"] == 0
    assert meta.collectives["all_gather"] == 1


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 4), st.integers(-40, 40), st.sampled_from([("a",), ("b",), ("a", "b"),
                                                                  ("b", "a")]),
       st.integers(0, 1))
def test_rolls_of_random_sizes_and_tilings(chunks, shift, axes, dim):
    devices = int(np.prod([MESH[a] for a in axes]))
    n = chunks * devices
    shape = (n, 3) if dim == 0 else (3, n)
    x = jax.random.normal(jax.random.key(0), shape)

    def f(x):
        return jnp.roll(x * 2.0, shift, axis=dim) - x

    meta = _check(f, axes, x, dim)
    if shift % n:  # (a roll by a multiple of n is written as a whole slice and an empty one)
        assert meta.collectives["all_gather"] == 0
        assert meta.collectives["collective_permute"] == _permutes(shift, n, devices)
