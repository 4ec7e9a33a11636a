import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from partir.core.actions import Loop, Tile
from partir.core.tmr import LocalContext, OpView, TileMapping, localized, lookup
from partir.frontend import trace
from partir.ir import TensorType
from tests.core.tmr.oracle import check_entry

rng = np.random.default_rng(0)
F32 = np.dtype(np.float32)


def _x(*shape):
    return rng.normal(size=shape).astype(np.float32)


def _view(name, params, in_shapes, out_shapes):
    return OpView(name, params, tuple(TensorType(s, F32) for s in in_shapes),
                  tuple(TensorType(s, F32) for s in out_shapes))


def _reshape_mappings(in_shape, out_shape):
    view = _view("reshape", {"new_sizes": out_shape, "dimensions": None, "sharding": None},
                 [in_shape], [out_shape])
    return list(lookup("reshape").mappings(view))


@pytest.mark.slow
def test_broadcast_in_dim():
    x = _x(8, 1, 4)
    # result dims: new 0, operand 0, operand 1 broadcast from 1, operand 2
    assert check_entry(lambda a: lax.broadcast_in_dim(a, (2, 8, 4, 4), (1, 2, 3)), x) >= 32


def test_broadcast_size_one_dim_is_not_tiled_on_the_operand():
    view = _view("broadcast_in_dim",
                 {"shape": (4, 8, 6), "broadcast_dimensions": (1, 2), "sharding": None},
                 [(1, 6)], [(4, 8, 6)])
    assert list(lookup("broadcast_in_dim").mappings(view)) == [
        TileMapping((None,), (Tile(0),)),
        TileMapping((None,), (Tile(1),)),
        TileMapping((1,), (Tile(2),)),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("in_shape,out_shape,min_checked", [
    ((4, 8, 6), (32, 6), 6),
    ((32, 6), (4, 8, 6), 6),
    ((4, 1, 8), (1, 4, 8, 1), 11),
    # one group whose major dims are 8 and 6: only 2 chunks divide both
    ((8, 6), (6, 8), 1),
])
def test_reshape(in_shape, out_shape, min_checked):
    x = _x(*in_shape)
    assert check_entry(lambda a: a.reshape(out_shape), x) >= min_checked


def test_reshape_tiles_major_dims_of_groups_only():
    assert _reshape_mappings((4, 8, 6), (32, 6)) == [
        TileMapping((0,), (Tile(0),)), TileMapping((2,), (Tile(1),))]
    assert _reshape_mappings((32, 6), (4, 8, 6)) == [
        TileMapping((0,), (Tile(0),)), TileMapping((1,), (Tile(2),))]
    # size-1 dims are skipped when finding a group's major dim
    assert _reshape_mappings((1, 4, 8), (4, 1, 2, 4)) == [
        TileMapping((1,), (Tile(0),)), TileMapping((2,), (Tile(2),))]
    # a minor dim of a merge/split is never tiled
    for m in _reshape_mappings((4, 8, 6), (32, 6)) + _reshape_mappings((32, 6), (4, 8, 6)):
        assert m.operands != (1,) or m.results != (Tile(0),)
        assert m.results != (Tile(1),) or m.operands != (0,)


def test_reshape_with_dimensions_or_zero_size_blocks():
    view = _view("reshape", {"new_sizes": (8, 4), "dimensions": (1, 0), "sharding": None},
                 [(4, 8)], [(8, 4)])
    assert list(lookup("reshape").mappings(view)) == []
    assert _reshape_mappings((0, 4), (4, 0)) == []


def test_transpose():
    assert check_entry(lambda a: a.transpose(2, 0, 1), _x(4, 8, 2)) >= 18


def test_squeeze():
    assert check_entry(lambda a: lax.squeeze(a, (1,)), _x(4, 1, 8)) >= 11


def test_expand_dims_is_broadcast_in_dim():
    assert check_entry(lambda a: jnp.expand_dims(a, 1), _x(4, 8)) >= 11


def test_rev():
    x = _x(4, 8, 2)
    assert check_entry(lambda a: lax.rev(a, (1,)), x) >= 7


def test_concatenate():
    assert check_entry(lambda a, b: jnp.concatenate([a, b], 1), _x(4, 3, 8), _x(4, 5, 8)) >= 11


def test_pad():
    x = _x(4, 6, 8)
    assert check_entry(lambda a: lax.pad(a, 1.5, [(0, 0, 0), (1, 2, 1), (0, 0, 0)]), x) >= 11


def test_slice():
    x = _x(4, 8, 8)
    checked = check_entry(lambda a: lax.slice(a, (0, 1, 0), (4, 7, 8), (1, 2, 1)), x)
    assert checked >= 11


def test_slice_partial_dims_are_not_tiled():
    view = _view("slice", {"start_indices": (0, 0, 2), "limit_indices": (4, 6, 8),
                           "strides": None}, [(4, 8, 8)], [(4, 6, 6)])
    assert list(lookup("slice").mappings(view)) == [TileMapping((0,), (Tile(0),))]


def test_split():
    def fn(a):
        return jnp.split(a, [2, 5], axis=1)

    assert check_entry(fn, _x(4, 8, 8)) >= 11


@pytest.mark.slow
def test_iota():
    assert check_entry(lambda: lax.broadcasted_iota(jnp.int32, (4, 8), 1)) >= 11
    assert check_entry(lambda: lax.broadcasted_iota(jnp.float32, (8, 4), 0)) >= 11


def test_iota_tiles_along_its_dimension_count_globally():
    op = trace(lambda: lax.broadcasted_iota(jnp.int32, (2, 8), 1)).function.ops[0]
    entry = lookup("iota")
    nest = [Loop("a", (Tile(1),), ())]
    local = _view("iota", op.params, [], [(2, 2)])
    local = OpView("iota", localized(entry, local), (), local.out_types)
    expected = np.arange(8).reshape(4, 2)

    def tile(k):
        ctx = LocalContext(nest, (), (op.results[0].type,), index=lambda _: k,
                           axis_size=lambda _: 4)
        return entry.apply(local, op.prim, [], ctx)[0]

    for k in range(4):
        np.testing.assert_array_equal(tile(k), np.broadcast_to(expected[k], (2, 2)))
    # the SPMD runtime passes a traced index
    for k in range(4):
        np.testing.assert_array_equal(jax.jit(tile)(jnp.int32(k)),
                                      np.broadcast_to(expected[k], (2, 2)))


def test_concatenate_along_the_concatenated_dimension_cuts_tiles_out_of_the_operands():
    # 8 and 4 are cut into tiles of 6 (2 devices) and 3 (4), across the operands' border.
    assert check_entry(lambda a, b: jnp.concatenate([a, b], 0), _x(8, 4), _x(4, 4)) >= 6

