"""PartIR:HLO ops: type rules, printing, and the interpreter's semantics of each
collective on explicit data."""

from __future__ import annotations

import numpy as np
import pytest
from jax import lax

from partir.hlo import (
    HloInterpreterError,
    HloLoweringError,
    count_collectives,
    interpret_hlo,
    lower_spmd_to_hlo,
    print_hlo,
    verify_hlo,
)
from partir.hlo.ops import (
    make_all_gather,
    make_all_reduce,
    make_all_slice,
    make_all_to_all,
    make_axis_index,
    make_collective_permute,
    make_reduce_scatter,
)
from partir.ir import Function, Op, RangeType, Region, TensorType, Value, VerificationError, verify
from partir.ir.printer import Printer
from partir.mesh import Mesh
from partir.spmd.ops import make_execute
from partir.spmd.types import DTensorType
from tests.listings import F32
from tests.listings import f32 as _t

MESH = Mesh({"a": 2, "b": 4})


def function(op: Op, in_sharding, out_sharding) -> Function:
    return Function("f", list(op.operands), [op], list(op.results), attributes={
        "mesh": MESH, "in_shardings": (in_sharding,), "out_shardings": (out_sharding,)})


def printed(op: Op) -> str:
    p = Printer()
    p.print_op(op, 0)
    return "\n".join(p.lines)


X = np.arange(8 * 16, dtype=F32).reshape(8, 16)


def test_all_to_all_moves_the_sharding_between_dimensions():
    # Each device holds rows of X by (a, b); after the exchange, columns by (a, b).
    x = Value(_t(1, 16), "x")
    op = make_all_to_all(x, 1, 0, ("a", "b"), MESH, "y")
    assert op.results[0].type == _t(8, 2)
    assert printed(op) == '%y = all_to_all {0 -> 1} <"a", "b"> %x : tensor<8x2xf32>'
    fn = function(op, (("a", "b"), ()), ((), ("a", "b")))
    verify_hlo(fn)
    np.testing.assert_array_equal(interpret_hlo(fn, X)[0], X)


def test_collective_permute_moves_chunks_between_devices():
    # Rows of X by (a, b): chunk t receives chunk t + 1's rows; chunk 7, targeted by no
    # pair, gets zeros.
    x = Value(_t(1, 16), "x")
    op = make_collective_permute(x, ("a", "b"), [(j + 1, j) for j in range(7)], "y")
    assert op.results[0].type == x.type
    assert printed(op) == ('%y = collective_permute <"a", "b"> {1 -> 0, 2 -> 1, 3 -> 2, '
                           '4 -> 3, 5 -> 4, 6 -> 5, 7 -> 6} %x : tensor<1x16xf32>')
    fn = function(op, (("a", "b"), ()), (("a", "b"), ()))
    verify_hlo(fn)
    want = np.concatenate([X[1:], np.zeros_like(X[:1])])
    np.testing.assert_array_equal(interpret_hlo(fn, X)[0], want)
    # over "b" alone: within each group of the four devices of one "a" coordinate
    op = make_collective_permute(x, ("b",), [(j, (j + 1) % 4) for j in range(4)], "y")
    groups = X.reshape(2, 4, 16)
    want = np.roll(groups, 1, axis=1).reshape(8, 16)
    np.testing.assert_array_equal(interpret_hlo(function(op, (("a", "b"), ()),
                                                         (("a", "b"), ())), X)[0], want)


def test_gather_and_slice_are_inverse():
    x = Value(_t(4, 4), "x")
    g = make_all_gather(x, (("a",), ("b",)), MESH, "g")
    s = make_all_slice(g.results[0], (("a",), ("b",)), MESH, "s")
    fn = Function("f", [x], [g, s], [g.results[0], s.results[0]], attributes={
        "mesh": MESH, "in_shardings": ((("a",), ("b",)),),
        "out_shardings": (((), ()), (("a",), ("b",)))})
    verify_hlo(fn)
    gathered, sliced = interpret_hlo(fn, X)
    np.testing.assert_array_equal(gathered, X)
    np.testing.assert_array_equal(sliced, X)


@pytest.mark.parametrize("monoid, combine", [("add", np.add), ("max", np.maximum)])
def test_reduce_scatter_reduces_then_scatters(monoid, combine):
    # Each device of axis b holds a different quarter of X's columns, as a 8x4 array: the
    # reduction combines the quarters, the scatter splits the rows over b.
    x = Value(_t(8, 4), "x")
    op = make_reduce_scatter(x, (("b",), ()), MESH, monoid, "y")
    fn = function(op, ((), ("b",)), (("b",), ()))
    verify_hlo(fn)
    want = X[:, 0:4]
    for k in range(1, 4):
        want = combine(want, X[:, 4 * k:4 * k + 4])
    np.testing.assert_allclose(interpret_hlo(fn, X)[0], want)


def test_all_reduce_and_axis_index_print():
    x = Value(_t(4,), "x")
    assert printed(make_all_reduce(x, ("a", "b"), "max", "y")) == \
        '%y = all_reduce<@max> <"a", "b"> %x : tensor<4xf32>'
    assert printed(make_reduce_scatter(x, (("b",),), MESH, "min", "y")) == \
        '%y = reduce_scatter<@min> [{"b"}] %x : tensor<1xf32>'
    assert printed(make_axis_index("b", "i")) == '%i = axis_index "b" : tensor<i32>'


def test_count_collectives_keys():
    x = Value(_t(8, 16), "x")
    s = make_all_slice(x, (("a",), ()), MESH)
    assert count_collectives(function(s, ((), ()), (("a",), ()))) == {
        "all_gather": 0, "all_reduce": 0, "reduce_scatter": 0, "all_to_all": 0,
        "collective_permute": 0, "all_slice": 1}


@pytest.mark.parametrize("make, message", [
    (lambda x: Op("hlo.all_slice", [x], [Value(_t(3, 16))], {"axes": (("a",), ())}),
     "cannot go from 8 to 3"),
    (lambda x: Op("hlo.all_gather", [x], [Value(_t(8, 16))], {"axes": (("a",), ("a",))}),
     "names an axis twice"),
    (lambda x: Op("hlo.all_reduce", [x], [Value(_t(8, 16))], {"axes": ("a",),
                                                              "monoid": "mul"}),
     "unknown monoid"),
    (lambda x: Op("hlo.all_to_all", [x], [Value(_t(8, 16))],
                  {"split_dim": 1, "concat_dim": 1, "axes": ("a",)}),
     "must be distinct dimensions"),
    (lambda x: make_collective_permute(x, ("a",), [(0, 1), (1, 1)]), "to one device twice"),
])
def test_type_rules_reject(make, message):
    x = Value(_t(8, 16), "x")
    op = make(x)
    with pytest.raises(VerificationError, match=message):
        verify(Function("f", [x], [op], op.results))


@pytest.mark.parametrize("op, message", [
    (Op("hlo.all_slice", [Value(_t(8, 16))], [Value(_t(2, 16))], {"axes": (("a",), ())}),
     "should be tensor<4x16xf32>"),
    (Op("hlo.all_gather", [Value(_t(8, 16))], [Value(_t(8, 32))], {"axes": ((), ("z",))}),
     "not in the mesh"),
    (Op("hlo.reduce_scatter", [Value(_t(6, 16))], [Value(_t(3, 16))],
        {"axes": (("b",), ()), "monoid": "add"}), "does not divide"),
    (make_collective_permute(Value(_t(8, 16)), ("a",), [(0, 2)]), "beyond the 2 of axes"),
])
def test_verify_hlo_checks_sizes_on_the_mesh(op, message):
    fn = Function("f", list(op.operands), [op], list(op.results), attributes={
        "mesh": MESH, "in_shardings": (((),) * op.operands[0].type.rank,),
        "out_shardings": (((),) * op.results[0].type.rank,)})
    with pytest.raises(VerificationError, match=message):
        verify_hlo(fn)


@pytest.mark.parametrize("result, axis, message", [
    (RangeType("a", 2), "a", "gives tensor<i32>"),  # the coordinate is a tensor, not a range
    (TensorType((), np.dtype("int32")), "q", "not in the mesh"),
])
def test_verify_hlo_checks_axis_index(result, axis, message):
    x = Value(_t(4,), "x")
    index = Op("hlo.axis_index", [], [Value(result)], {"axis": axis})
    fn = Function("f", [x], [index], [x], attributes={
        "mesh": MESH, "in_shardings": (((),),), "out_shardings": (((),),)})
    with pytest.raises(VerificationError, match=message):
        verify_hlo(fn)


def test_verify_hlo_checks_shardings():
    x = Value(_t(8, 16), "x")
    op = Op("neg", [x], [Value(_t(8, 16))], prim=lax.neg_p)
    for bad in [((("a",),),), ((("a",), ("a",)),), ((("q",), ()),), ()]:
        fn = Function("f", [x], [op], op.results, attributes={
            "mesh": MESH, "in_shardings": bad, "out_shardings": (((), ()),)})
        with pytest.raises(VerificationError):
            verify_hlo(fn)


def test_interpreter_rejects_a_result_that_is_not_what_its_sharding_says():
    # The argument differs along a, yet the result claims to be replicated.
    x = Value(_t(4, 16), "x")
    op = Op("neg", [x], [Value(_t(4, 16), "y")], prim=lax.neg_p)
    fn = function(op, (("a",), ()), ((), ()))
    assert "in_shardings=[[{\"a\"}, {}]], out_shardings=[[{}, {}]]" in print_hlo(fn)
    with pytest.raises(HloInterpreterError, match="disagree"):
        interpret_hlo(fn, X)


def test_stacked_results_do_not_lower():
    x = Value(DTensorType.of(_t(4,)), "x")
    r = Value(RangeType("a", 2), "ra")
    y = Value(_t(4,), "y")
    out = Value(DTensorType.of(_t(4,), ("a",)), "out")
    execute = make_execute(("a",), MESH, [x], [r], [y], [], [y], [out])
    spmd = Function("f", [x], [execute], [out], attributes={"mesh": MESH})
    with pytest.raises(HloLoweringError, match="stacked"):
        lower_spmd_to_hlo(spmd)


def test_collective_permute_inside_a_loop_body_runs_in_lockstep():
    """The interpreter runs a body holding collectives on every device at once, under
    vmaps naming the axes (whose ppermute batching takes one axis and a whole
    permutation): over two axes, with devices receiving nothing, as at the top level."""
    c = Value(_t(1, 16), "c")
    shifted = make_collective_permute(c, ("b", "a"), [(j + 1, j) for j in range(7)])
    x = Value(_t(1, 16), "x")
    loop = Op("scan", [x], [Value(x.type, "y")],
              {"length": 2, "num_consts": 0, "num_carry": 1, "reverse": False, "unroll": 1,
               "linear": (False,), "_split_transpose": False},
              regions=[Region([c], [shifted], shifted.results)])
    fn = function(loop, (("b", "a"), ()), (("b", "a"), ()))
    verify_hlo(fn)
    want = np.concatenate([X[2:], np.zeros_like(X[:2])])  # two steps up, zeros in
    np.testing.assert_array_equal(interpret_hlo(fn, X)[0], want)
