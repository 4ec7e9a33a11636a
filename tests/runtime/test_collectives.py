"""Each PartIR:HLO collective alone, executed on {"B":4, "M":2} (8 CPU devices), against a
numpy reference computed on the global arrays. Every device's tile is checked, so a
replicated result must really be equal on all devices."""

from __future__ import annotations

import numpy as np
import pytest

from partir.mesh import Mesh
from partir.runtime import build_callable
from tests.runtime.programs import MESH, Builder, local_shape, normal

R = ((), ())


def check_shards(out, want, rtol=1e-5, atol=1e-5):
    assert out.shape == want.shape and out.dtype == want.dtype
    for shard in out.addressable_shards:
        np.testing.assert_allclose(np.asarray(shard.data), want[shard.index],
                                   rtol=rtol, atol=atol)


def run_collective(name, x, in_sharding, out_sharding, want, **params):
    b = Builder()
    arg = b.arg("x", x.shape, in_sharding, dtype=x.dtype)
    y = b.collective(name, arg, local_shape(want.shape, out_sharding, MESH), **params)
    exe = build_callable(b.build([y], [out_sharding]))
    (out,) = exe(x)
    assert out.sharding.is_equivalent_to(exe.output_shardings[0], out.ndim)
    check_shards(out, want)


def _groups(x, *sizes):
    """x with dimension 0 split into (sizes..., rest)."""
    return x.reshape(*sizes, -1, *x.shape[1:])


@pytest.mark.parametrize("in_sharding, axes, out_sharding", [
    (R, (("B",), ()), (("B",), ())),
    (R, (("B", "M"), ()), (("B", "M"), ())),
    (R, (("M", "B"), ()), (("M", "B"), ())),
    (R, (("M",), ("B",)), (("M",), ("B",))),
    # slicing a dimension already split over B splits each B-tile over M
    ((("B",), ()), (("M",), ()), (("B", "M"), ())),
])
def test_all_slice(in_sharding, axes, out_sharding):
    x = normal((16, 8))
    run_collective("all_slice", x, in_sharding, out_sharding, x, axes=axes)


@pytest.mark.parametrize("in_sharding, axes, out_sharding", [
    ((("B",), ()), (("B",), ()), R),
    ((("B", "M"), ()), (("B", "M"), ()), R),
    ((("M", "B"), ()), (("M", "B"), ()), R),
    ((("B",), ("M",)), (("B",), ("M",)), R),
    # gathering the minor axis of a multi-axis dimension leaves the major one
    ((("B", "M"), ()), (("M",), ()), (("B",), ())),
])
def test_all_gather(in_sharding, axes, out_sharding):
    x = normal((16, 8))
    run_collective("all_gather", x, in_sharding, out_sharding, x, axes=axes)


@pytest.mark.parametrize("in_sharding, axes, out_sharding, want", [
    ((("M",), ()), ("M",), R, lambda x: _groups(x, 2).sum(0)),
    ((("B", "M"), ()), ("B", "M"), R, lambda x: _groups(x, 8).sum(0)),
    ((("B", "M"), ()), ("M",), (("B",), ()),
     lambda x: _groups(x, 4, 2).sum(1).reshape(-1, x.shape[1])),
    # over the major axis of a dimension split over (M, B): a sum of B-tiles per M
    ((("M", "B"), ()), ("B",), (("M",), ()),
     lambda x: _groups(x, 2, 4).sum(1).reshape(-1, x.shape[1])),
])
def test_all_reduce_add(in_sharding, axes, out_sharding, want):
    x = normal((48, 5))
    run_collective("all_reduce", x, in_sharding, out_sharding, want(x), axes=axes,
                   monoid="add")


@pytest.mark.parametrize("monoid, dtype, reduce", [
    ("max", np.float32, np.max), ("min", np.int32, np.min),
    ("and", np.bool_, np.all), ("or", np.bool_, np.any),
])
def test_all_reduce_monoids(monoid, dtype, reduce):
    rng = np.random.default_rng(1)
    # sparse trues, so that `or` over 8 devices is not trivially all true
    x = (rng.integers(-50, 50, size=(24, 3)) if dtype != np.bool_ else
         rng.random(size=(24, 3)) > (0.9 if monoid == "or" else 0.1)).astype(dtype)
    want = reduce(_groups(x, 8), axis=0)
    if dtype == np.bool_:
        assert want.any() and not want.all()
    run_collective("all_reduce", x, (("B", "M"), ()), R, want, axes=("B", "M"),
                   monoid=monoid)


@pytest.mark.parametrize("monoid", ["max", "min"])
def test_all_reduce_extremes_propagate_nan(monoid):
    """NaN held by one device wins, as in jnp.maximum/minimum: XLA's CPU all-reduce
    alone skips it (max(nan, -inf) = -inf). Infinities and a NaN on every device too."""
    x = normal((24, 3))
    x[0, 0] = x[5, 1] = x[4, 2] = np.nan  # on one device each (device d: rows 3d-3d+2)
    x[3:24:3, 0] = -np.inf if monoid == "max" else np.inf
    x[0:24:3, 2] = np.nan  # every device
    reduce = np.max if monoid == "max" else np.min
    want = reduce(_groups(x, 8), axis=0)
    assert np.isnan(want).sum() == 4
    run_collective("all_reduce", x, (("B", "M"), ()), R, want, axes=("B", "M"),
                   monoid=monoid)


@pytest.mark.parametrize("in_sharding, axes, out_sharding, want", [
    ((("M",), ()), (("M",), ()), (("M",), ()), lambda x: _groups(x, 2).sum(0)),
    ((("B", "M"), ()), (("B", "M"), ()), (("B", "M"), ()), lambda x: _groups(x, 8).sum(0)),
    ((("M", "B"), ()), (("M", "B"), ()), (("M", "B"), ()), lambda x: _groups(x, 8).sum(0)),
    # two scattered dimensions: reduce over B and M, then dim 0 over B and dim 1 over M
    ((("B", "M"), ()), (("B",), ("M",)), (("B",), ("M",)), lambda x: _groups(x, 8).sum(0)),
    # reducing the minor axis of a multi-axis dimension, scattering that dimension again
    ((("B", "M"), ()), (("M",), ()), (("B", "M"), ()),
     lambda x: _groups(x, 4, 2).sum(1).reshape(-1, x.shape[1])),
])
def test_reduce_scatter_add(in_sharding, axes, out_sharding, want):
    x = normal((128, 4))
    run_collective("reduce_scatter", x, in_sharding, out_sharding, want(x), axes=axes,
                   monoid="add")


def test_reduce_scatter_max():
    x = normal((128, 4))
    run_collective("reduce_scatter", x, (("B", "M"), ()), (("B",), ("M",)),
                   _groups(x, 8).max(0), axes=(("B",), ("M",)), monoid="max")


@pytest.mark.parametrize("in_sharding, split_dim, concat_dim, axes, out_sharding", [
    # the contract's example: local tensor<16x32> -> tensor<128x4> over 8 devices
    ((("B", "M"), ()), 1, 0, ("B", "M"), ((), ("B", "M"))),
    ((("M", "B"), ()), 1, 0, ("M", "B"), ((), ("M", "B"))),
    ((("B", "M"), ()), 1, 0, ("M",), (("B",), ("M",))),
    (((), ("B",)), 0, 1, ("B",), (("B",), ())),
])
def test_all_to_all(in_sharding, split_dim, concat_dim, axes, out_sharding):
    x = normal((128, 32))
    run_collective("all_to_all", x, in_sharding, out_sharding, x, split_dim=split_dim,
                   concat_dim=concat_dim, axes=axes)


def test_all_to_all_local_types_of_the_contract_example():
    b = Builder()
    x = b.arg("x", (128, 32), (("B", "M"), ()))
    y = b.collective("all_to_all", x, (128, 4), split_dim=1, concat_dim=0, axes=("B", "M"))
    assert (x.type.shape, y.type.shape) == ((16, 32), (128, 4))


def _permuted(x, groups, pairs, group_axis=0):
    """x's dimension 0 split into `groups` chunks, chunk t replaced by chunk s for each
    (s, t) and zero where no pair targets it."""
    chunks = np.split(x, groups, axis=group_axis)
    out = [np.zeros_like(c) for c in chunks]
    for s, t in pairs:
        out[t] = chunks[s]
    return np.concatenate(out, axis=group_axis)


@pytest.mark.parametrize("sharding, axes, pairs", [
    ((("B",), ()), ("B",), [(j, (j + 1) % 4) for j in range(4)]),  # a cyclic shift
    ((("B",), ()), ("B",), [(j + 1, j) for j in range(3)]),  # chunk 3 gets zeros
    ((("B", "M"), ()), ("B", "M"), [(j, (j + 3) % 8) for j in range(8)]),
    ((("M", "B"), ()), ("M", "B"), [(j, 7 - j) for j in range(8)]),
    # not the mesh's axis order, where JAX's ppermute numbers devices otherwise
    ((("M", "B"), ()), ("M", "B"), [(j, (j + 1) % 8) for j in range(8)]),
])
def test_collective_permute(sharding, axes, pairs):
    x = normal((32, 8))
    run_collective("collective_permute", x, sharding, sharding,
                   _permuted(x, 4 if len(axes) == 1 else 8, pairs), axes=axes,
                   pairs=tuple(pairs))


def test_collective_permute_within_groups_of_the_other_axis():
    """Over "M" alone, each "B" group of two permutes within itself."""
    x = normal((16, 8))
    want = np.concatenate([_permuted(g, 2, [(1, 0)]) for g in np.split(x, 4)])
    run_collective("collective_permute", x, (("B", "M"), ()), (("B", "M"), ()), want,
                   axes=("M",), pairs=((1, 0),))


def test_collectives_over_one_device_axes_are_not_given_to_xla():
    """Over an axis of one device every collective is the identity: the program XLA gets
    has none (XLA keeps them, as copies and temporaries), and the results are the ones
    over the other axes alone."""
    mesh = Mesh({"B": 4, "U": 1})
    b = Builder(mesh)
    x = b.arg("x", (16, 8), (("B", "U"), ()))
    g = b.collective("all_gather", x, (16, 8), axes=(("B", "U"), ()))
    r = b.collective("all_reduce", g, (16, 8), axes=("U",), monoid="add")
    m = b.collective("all_reduce", r, (16, 8), axes=("U",), monoid="max")
    s = b.collective("reduce_scatter", m, (16, 8), axes=(("U",), ()), monoid="add")
    t = b.collective("all_to_all", s, (16, 8), split_dim=0, concat_dim=1, axes=("U",))
    y = b.collective("all_slice", t, (4, 8), axes=(("U", "B"), ()))
    exe = build_callable(b.build([y], [(("B",), ())]))
    text = exe.lower().as_text()
    assert text.count("stablehlo.all_gather") == 1 and not any(
        f"stablehlo.{c}" in text for c in ("all_reduce", "reduce_scatter", "all_to_all",
                                           "collective_permute")), text
    x_global = normal((16, 8))
    (out,) = exe(x_global)
    check_shards(out, x_global)
