"""Distributed types, the typing rules TExec / TTileRed / TRedist, and the interpreter's
data layout (which devices hold which tiles)."""

from __future__ import annotations

import numpy as np
import pytest
from jax import lax

from partir.core.actions import ANY, Sum, Tile
from partir.core.dialect import make_slice
from partir.core.interpreter import InterpreterError
from partir.ir import Function, Op, RangeType, TensorType, Value, VerificationError, verify
from partir.mesh import Mesh
from partir.spmd import DTensorType, SpmdInterpreterError, interpret_spmd
from partir.spmd.interpreter import SpmdInterpreter
from partir.spmd.ops import make_execute, make_redistribute, make_tile_reduce, tile_reduce_type
from tests.listings import F32
from tests.listings import f32 as _t

MESH = Mesh({"a": 4, "b": 2})


def _d(stacked: tuple[str, ...], *dims: tuple[tuple[str, ...], int] | int,
       dtype: np.dtype = F32) -> DTensorType:
    return DTensorType(stacked, tuple(((), d) if isinstance(d, int) else d for d in dims),
                       dtype)


# --- types ----------------------------------------------------------------------------------


def test_types_print_in_the_paper_syntax():
    assert str(_d(("a", "b"), 64, 8)) == 'dtensor<{"a","b"}, [64,8]>'
    assert str(_d((), (("a",), 256), 8)) == 'dtensor<{}, [{"a"}256,8]>'
    assert str(_d((), 256, (("b", "a"), 8))) == 'dtensor<{}, [256,{"b","a"}8]>'
    assert str(_d((), 4, dtype=np.dtype("int32"))) == "dtensor<{}, [4], i32>"


def test_local_and_global_types_of_the_paper_figure():
    """Fig. spmd-distributed-types: a 256x8 matrix over {a:4, b:2}."""
    assert _d((), (("a",), 256), 8).local_type(MESH) == _t(64, 8)
    assert _d((), 256, (("b",), 8)).local_type(MESH) == _t(256, 4)
    assert _d((), (("a",), 256), (("b",), 8)).local_type(MESH) == _t(64, 4)
    assert _d((), 256, (("a", "b"), 8)).local_type(MESH) == _t(256, 1)
    assert _d((), (("a",), 256), (("b",), 8)).global_type(MESH) == _t(256, 8)
    assert _d(("a", "b"), 64, 4).local_type(MESH) == _t(64, 4)
    with pytest.raises(ValueError, match="stacked"):
        _d(("a", "b"), 64, 4).global_type(MESH)
    # 4 does not divide 6: the dimension is padded to 8, in tiles of 2.
    assert _d((), (("a",), 6)).check(MESH) is None
    assert _d((), (("a",), 6)).local_type(MESH) == _t(2)
    assert _d((), (("a", "b"), 6)).local_type(MESH) == _t(1)
    # Only the first axis pads: tiles of 3 on b are not split again on a.
    assert "does not divide" in _d((), (("b", "a"), 6)).check(MESH)
    assert _d(("a",), (("a",), 8)).check(MESH) is not None  # an axis twice


def test_tile_reduce_types_of_the_paper_examples():
    """[#tile<a,0>, #tile<b,1>] views dtensor<{a,b}, [64,4]> as [{a}256, {b}8]; with
    [#tile<a,1>, #tile<b,0>] as [{b}128, {a}16]; [#sum<a>, #sum<b>] leaves [64,4]. The
    actions consume the last stacked axis first."""
    t = _d(("a", "b"), 64, 4)

    def apply(t, *actions):
        for axis, action in actions:
            t = tile_reduce_type(t, axis, action, MESH)
        return t

    assert apply(t, ("b", Tile(1)), ("a", Tile(0))) == _d((), (("a",), 256), (("b",), 8))
    assert apply(t, ("b", Tile(0)), ("a", Tile(1))) == _d((), (("b",), 128), (("a",), 16))
    assert apply(t, ("b", Sum()), ("a", Sum())) == _d((), 64, 4)
    # tiling a dimension already split: the new axis is its major one
    assert apply(t, ("b", Tile(0)), ("a", Tile(0))) == _d((), (("a", "b"), 512), 4)


# --- typing rules ---------------------------------------------------------------------------


def _add_execute(x_type: DTensorType, local: TensorType, result: DTensorType,
                 axes: tuple[str, ...] = ("a", "b")) -> Function:
    x = Value(x_type, "x")
    ranges = [Value(RangeType(a, MESH[a]), f"r{a}") for a in axes]
    y = Value(local, "y")
    s = Value(local)
    r = Value(result, "r")
    op = make_execute(axes, MESH, [x], ranges, [y], [Op("add", [y, y], [s], prim=lax.add_p)],
                      [s], [r])
    return Function("f", [x], [op], [r], attributes={"mesh": MESH})


def test_texec_accepts_the_paper_example_and_stacked_operands():
    verify(_add_execute(_d((), (("a",), 256), (("b",), 8)), _t(64, 4), _d(("a", "b"), 64, 4)))
    verify(_add_execute(_d(("a", "b"), 64, 4), _t(64, 4), _d(("a", "b"), 64, 4)))
    verify(_add_execute(_d(("a",), 64, 4), _t(64, 4), _d(("a", "b"), 64, 4)))


@pytest.mark.parametrize("fn, message", [
    # the local is not L(mu) of its operand
    (lambda: _add_execute(_d((), (("a",), 256), 8), _t(256, 8), _d(("a", "b"), 256, 8)),
     "local of operand"),
    # the result is not stacked on the execute's axes
    (lambda: _add_execute(_d((), 64, 4), _t(64, 4), _d(("a",), 64, 4)), "should be"),
    # an operand stacked on an axis the execute does not span first
    (lambda: _add_execute(_d(("b",), 64, 4), _t(64, 4), _d(("a", "b"), 64, 4)), "prefix"),
    # an operand distributed over an axis the execute does not span
    (lambda: _add_execute(_d((), (("b",), 64), 4), _t(32, 4), _d(("a",), 32, 4), ("a",)),
     "does not span"),
])
def test_texec_rejects_ill_typed_executes(fn, message):
    with pytest.raises(VerificationError, match=message):
        verify(fn())


def test_texec_rejects_a_body_capturing_an_outer_value():
    x = Value(_d((), 4), "x")
    outer = Value(_d((), 4), "outer")
    neg = Op("neg", [x], [outer], prim=lax.neg_p)
    ra, y, s = Value(RangeType("a", 4), "ra"), Value(_t(4), "y"), Value(_t(4))
    ex = make_execute(("a",), MESH, [x], [ra], [y], [Op("add", [y, outer], [s],
                                                        prim=lax.add_p)], [s],
                      [Value(_d(("a",), 4))])
    with pytest.raises(VerificationError, match="not an argument of the execute"):
        verify(Function("f", [x], [neg, ex], ex.results, attributes={"mesh": MESH}))


def _tile_reduce(x_type: DTensorType, axis: str, action, result: DTensorType) -> Function:
    x = Value(x_type, "x")
    r = Value(result, "r")
    return Function("f", [x], [make_tile_reduce(x, axis, action, MESH, r)], [r])


def test_ttilered_accepts_tiles_and_sums():
    verify(_tile_reduce(_d(("a", "b"), 64, 4), "b", Tile(1), _d(("a",), 64, (("b",), 8))))
    verify(_tile_reduce(_d(("a", "b"), 64, 4), "b", Sum("max"), _d(("a",), 64, 4)))
    verify(_tile_reduce(_d(("a",), 64, 4), "a", ANY, _d((), 64, 4)))
    # Tiles of 2 on a (4) make a dimension of 8, or of 5 to 7 padded to 8 (not 4).
    verify(_tile_reduce(_d(("a",), 2, 4), "a", Tile(0), _d((), (("a",), 6), 4)))
    verify(_tile_reduce(_d(("a",), 2, 4), "a", Tile(0), _d((), (("a",), 8), 4)))
    with pytest.raises(VerificationError, match="should be"):
        verify(_tile_reduce(_d(("a",), 2, 4), "a", Tile(0), _d((), (("a",), 4), 4)))


@pytest.mark.parametrize("x_type, axis, action, result, message", [
    # the action must consume the last stacked axis
    (_d(("a", "b"), 64, 4), "a", Sum(), _d(("b",), 64, 4), "last stacked axis"),
    # the tiled dimension grows by the axis size
    (_d(("a",), 64, 4), "a", Tile(0), _d((), (("a",), 64), 4), "should be"),
    # a sum does not tile
    (_d(("a",), 64, 4), "a", Sum(), _d((), (("a",), 256), 4), "should be"),
])
def test_ttilered_rejects_ill_typed_tile_reduces(x_type, axis, action, result, message):
    with pytest.raises(VerificationError, match=message):
        verify(_tile_reduce(x_type, axis, action, result))


def _redistribute(x_type, result) -> Function:
    x = Value(x_type, "x")
    r = Value(result, "r")
    return Function("f", [x], [make_redistribute(x, MESH, r)], [r])


def test_tredist_accepts_data_equivalent_types():
    verify(_redistribute(_d((), 256, (("a", "b"), 8)), _d((), 256, (("b",), 8))))
    verify(_redistribute(_d(("a",), (("b",), 64), 4), _d(("a",), 64, 4)))
    verify(_redistribute(_d((), (("a",), 256), 8), _t(256, 8)))  # EqMT


@pytest.mark.parametrize("x_type, result", [
    (_d((), 256, 8), _d((), 128, 16)),  # another global shape
    (_d(("a",), 64, 4), _d((), (("a",), 256), 4)),  # stacked axes are preserved
    (_d((), 256, 8), _d((), 256, 8, dtype=np.dtype("int32"))),
])
def test_tredist_rejects_types_of_different_data(x_type, result):
    with pytest.raises(VerificationError, match="do not distribute the same data"):
        verify(_redistribute(x_type, result))


def test_tredist_rejects_an_ill_formed_target():
    # 6 on b has tiles of 3, which a (4) cannot split again (only a first axis pads).
    with pytest.raises(VerificationError, match="does not divide"):
        verify(_redistribute(_d((), 6, 8), _d((), (("b", "a"), 6), 8)))


# --- interpreter layout ---------------------------------------------------------------------


def _tiles_of(t: DTensorType, x: np.ndarray) -> dict:
    """The local tensors the interpreter gives an argument of type t."""
    fn = Function("f", [Value(t, "x")], [], [], attributes={"mesh": MESH})
    interp = SpmdInterpreter(fn)
    return interp.layout.split(t, {(): x})


def test_layout_of_the_redistribution_figure():
    """Fig. spmd-redistribution-allgather: with [256, {a,b}8] device (a=i, b=j) holds
    column 2i+j (a is major); with [256, {b}8] it holds columns 4j..4j+3."""
    x = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
    ab = _tiles_of(_d((), 256, (("a", "b"), 8)), x)
    for i in range(4):
        for j in range(2):
            np.testing.assert_array_equal(ab[(i, j)], x[:, 2 * i + j:2 * i + j + 1])
    b = _tiles_of(_d((), 256, (("b",), 8)), x)
    assert sorted(b) == [(0,), (1,)]
    np.testing.assert_array_equal(b[(1,)], x[:, 4:8])


def _tiles_per_device(actions: list[tuple[str, object]]) -> Function:
    """execute "a" "b" giving device (i, j) the rows 2(2i+j)..2(2i+j)+1 of a 16x2 %x,
    then the tile_reduces, then a redistribute to the whole result on every device."""
    x = Value(_d((), 16, 2), "x")
    ra, rb, y = Value(RangeType("a", 4), "ra"), Value(RangeType("b", 2), "rb"), Value(_t(16, 2))
    rows, tile = Value(_t(4, 2)), Value(_t(2, 2))
    stacked = Value(_d(("a", "b"), 2, 2), "stacked")
    ops = [make_execute(("a", "b"), MESH, [x], [ra, rb], [y],
                        [make_slice(y, 0, ra, rows), make_slice(rows, 0, rb, tile)], [tile],
                        [stacked])]
    cur = stacked
    for axis, action in actions:
        nxt = Value(tile_reduce_type(cur.type, axis, action, MESH))
        ops.append(make_tile_reduce(cur, axis, action, MESH, nxt))
        cur = nxt
    out = Value(_d(cur.type.stacked, *cur.type.sizes), "out")
    ops.append(make_redistribute(cur, MESH, out))
    fn = Function("f", [x], ops, [out], attributes={"mesh": MESH})
    verify(fn)
    return fn


def test_tile_reduce_then_redistribute_follows_the_loop_semantics():
    """Each result is what nested loops `a` then `b` with these actions compute from
    the device tiles: a #tile<a> concatenation of #tile<b> (or #sum<b>) results."""
    x = np.arange(32, dtype=np.float32).reshape(16, 2)
    tiles = [[x[2 * (2 * i + j):2 * (2 * i + j) + 2] for j in range(2)] for i in range(4)]

    def run(*actions):
        return np.asarray(interpret_spmd(_tiles_per_device(list(actions)), x)[0])

    # the same dimension tiled twice: its axes are {a,b}, a major, and the data come back
    np.testing.assert_array_equal(run(("b", Tile(0)), ("a", Tile(0))), x)
    np.testing.assert_array_equal(
        run(("b", Tile(1)), ("a", Tile(0))),
        np.concatenate([np.concatenate(row, axis=1) for row in tiles], axis=0))
    np.testing.assert_array_equal(
        run(("b", Sum()), ("a", Tile(1))),
        np.concatenate([row[0] + row[1] for row in tiles], axis=1))
    np.testing.assert_array_equal(run(("b", Sum("max")), ("a", Sum())),
                                  sum(np.maximum(*row) for row in tiles))
    with pytest.raises(InterpreterError, match="any"):  # the tiles differ along b
        run(("b", ANY), ("a", Tile(0)))


def test_interpreter_rejects_stacked_results():
    fn = _tiles_per_device([])
    fn.ops.pop()
    fn.results = fn.ops[-1].results
    with pytest.raises(SpmdInterpreterError, match="stacked"):
        interpret_spmd(fn, np.zeros((16, 2), np.float32))
