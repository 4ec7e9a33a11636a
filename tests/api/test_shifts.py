"""Rolls and shifts of a sliced dimension move tiles between neighbouring devices with
collective_permutes (`permute_shifted_tiles` in partir/hlo/fusion.py) instead of gathering
the dimension, and so do their gradients: on both oracles and the HLO interpreter, equal
to the function (a pipeline written with them: tests/examples/test_pipeline.py)."""

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
    # The roll's slices are reported as what they cost: a permute, not a gather.
    kinds = {c["kind"] for t in meta.tactics for c in t.conflicts}
    assert kinds <= {"shifted_tiles"}, kinds


def test_a_roll_along_the_second_dimension():
    def f(x):
        return jnp.roll(x, 3, axis=1) + x

    x = jnp.arange(64.0).reshape(4, 16)
    meta = _check(f, ("a",), x, dim=1)
    assert meta.collectives["all_gather"] == 0
    assert meta.collectives["collective_permute"] == _permutes(3, 16, 4) == 1


def test_the_gradient_of_a_roll_permutes_back():
    """JAX transposes a roll into splits, zero pads and a sum: each device's tile of a
    pad is a neighbour's piece or zeros, one permute each, and the two permutes of the sum
    target different devices: one permute."""
    def f(x):
        return jnp.sum(jnp.sin(jnp.roll(x, 1, axis=0)) * x)

    x = jnp.arange(64.0).reshape(16, 4) / 10
    meta = check_oracles(jax.grad(f), MESH, _tiled_on(("a",)), x)
    assert meta.collectives["all_gather"] == 0
    assert meta.collectives["collective_permute"] == 2  # the roll and its transpose


def test_a_shift_filling_zeros_sends_nothing_to_the_first_device():
    """x shifted down by one row, zeros entering at the top: the first device receives
    nothing and keeps zeros (a permute's devices no pair targets)."""
    def f(x):
        return jnp.pad(x[:-1], ((1, 0), (0, 0))) * x

    x = jnp.arange(64.0).reshape(16, 4)
    meta = _check(f, ("a",), x)
    assert meta.collectives["all_gather"] == 0 and meta.collectives["collective_permute"] == 1


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


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(1, 3), st.integers(-20, 20), st.sampled_from([("a",), ("a", "b")]))
def test_gradients_of_rolls_of_random_sizes_permute_back(chunks, shift, axes):
    devices = int(np.prod([MESH[a] for a in axes]))
    n = chunks * devices
    x = jax.random.normal(jax.random.key(1), (n, 3))

    def f(x):
        return jnp.sum(jnp.roll(x * 2.0, shift, axis=0) * x)

    meta = check_oracles(jax.grad(f), MESH, _tiled_on(axes), x)
    if shift % n:
        assert meta.collectives["all_gather"] == 0
        assert meta.collectives["collective_permute"] == \
            _permutes(shift, n, devices) + _permutes(-shift, n, devices)


@settings(max_examples=examples(40), deadline=None)
@given(st.data())
def test_random_rearrangements_of_a_sliced_dimension(data):
    """Pieces of x (random cuts, in a random order, some replaced by zeros) concatenated
    along its sliced dimension, times x: permutes where every device's tile is laid out
    alike, gathers elsewhere, and always the function's values."""
    axes = data.draw(st.sampled_from([("a",), ("a", "b")]))
    devices = int(np.prod([MESH[a] for a in axes]))
    n = devices * data.draw(st.integers(1, 3))
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=3)))
    bounds = list(zip([0, *cuts], [*cuts, n], strict=True))
    order = data.draw(st.permutations(range(len(bounds))))
    zeroed = data.draw(st.sets(st.sampled_from(range(len(bounds)))))
    x = jax.random.normal(jax.random.key(2), (n, 3))

    def f(x):
        pieces = [jnp.zeros_like(x[a:b]) if k in zeroed else x[a:b]
                  for k, (a, b) in ((k, bounds[k]) for k in order)]
        return jnp.concatenate(pieces) * x

    _check(f, axes, x)


def test_a_slice_every_device_takes_from_one_chunk_is_no_permute():
    """dynamic_slice(x, 0, 4) of x sliced over 2 devices: both take the first device's
    chunk, which one permute cannot send (its sources are distinct); it stays gathered."""
    def f(x):
        return jax.lax.dynamic_slice(jnp.negative(-x), (0,), (4,))

    x = jnp.arange(8.0)
    meta = check_oracles(f, partir.Mesh({"a": 2}), [partir.ManualPartition({"x": 0}, axis="a")],
                         x)
    assert meta.collectives["collective_permute"] == 0


def test_a_roll_under_an_outer_jit():
    """Lowered inside the caller's trace, the start offsets are still evaluated."""
    def f(x):
        return jnp.sin(jnp.roll(jnp.cos(x), 5, axis=0)) * x

    fn, meta = partir.jit(f, MESH, _tiled_on(("a",)))
    x = jnp.arange(64.0).reshape(16, 4)
    assert_same(jax.jit(fn)(x), f(x), "under jax.jit")
    assert meta.collectives["collective_permute"] == 2
