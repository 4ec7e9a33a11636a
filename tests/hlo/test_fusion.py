"""The fusion passes one by one, on small hand-written PartIR:HLO programs: each rewrite
has the expected shape and computes what its input computes on the simulated mesh."""

from __future__ import annotations

import math

import numpy as np
import pytest
from jax import lax
from jax.extend.core.primitives import add_jaxvals_p

from partir.hlo import count_collectives, interpret_hlo, optimize, print_hlo, verify_hlo
from partir.hlo.fusion import (
    cancel_gather_slice,
    cse,
    dce,
    fuse_all_to_all,
    fuse_reduce_scatter,
    localize_arguments,
    localize_results,
    merge_collectives,
    reassociate_reductions,
    reduce_before_gather,
    schedule_by_demand,
    slice_before_reduce_scatter,
    transpose_before_gather,
)
from partir.hlo.ops import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_SLICE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    make_all_gather,
    make_all_reduce,
    make_all_slice,
    make_reduce_scatter,
)
from partir.ir import Function, Op, Region, Value
from partir.mesh import Mesh
from tests.listings import F32
from tests.listings import f32 as _t

MESH = Mesh({"a": 2, "b": 2, "c": 2})


def function(args, ops, results, in_shardings=None, out_shardings=None) -> Function:
    """A function on MESH; arguments and results are replicated unless told otherwise."""
    fn = Function("f", list(args), list(ops), list(results), attributes={
        "mesh": MESH,
        "in_shardings": in_shardings or tuple(((),) * a.type.rank for a in args),
        "out_shardings": out_shardings or tuple(((),) * r.type.rank for r in results)})
    verify_hlo(fn, check_primitives=True)
    return fn


def _global_shape(v: Value, sharding) -> tuple[int, ...]:
    return tuple(n * math.prod(MESH[a] for a in axes)
                 for n, axes in zip(v.type.shape, sharding, strict=True))


def assert_same(before: Function, after: Function, seed: int = 0) -> None:
    """Both functions verify and compute the same global results on the same global
    arguments."""
    verify_hlo(after, check_primitives=True)
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=_global_shape(a, s)).astype(F32)
            for a, s in zip(before.args, before.attributes["in_shardings"], strict=True)]
    for b, a in zip(interpret_hlo(before, *args), interpret_hlo(after, *args), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def names(fn: Function) -> list[str]:
    return [op.name for op in fn.ops]


def add(x: Value, y: Value, name: str | None = None, prim=lax.add_p) -> Op:
    return Op(prim.name, [x, y], [Value(x.type, name)], prim=prim)


def test_passes_return_their_input_when_nothing_applies():
    x = Value(_t(8, 4), "x")
    op = add(x, x)
    fn = function([x], [op], op.results)
    for p in (cancel_gather_slice, cse, dce, fuse_all_to_all, fuse_reduce_scatter,
              localize_arguments, localize_results, merge_collectives, reassociate_reductions,
              reduce_before_gather, schedule_by_demand, slice_before_reduce_scatter,
              transpose_before_gather):
        assert p(fn) is fn, p.__name__
    assert optimize(fn) is fn


def test_slices_merge_minor_last():
    x = Value(_t(8, 4), "x")
    s1 = make_all_slice(x, (("a",), ()), MESH)
    s2 = make_all_slice(s1.results[0], (("b",), ("c",)), MESH)
    fn = function([x], [s1, s2], s2.results, out_shardings=((("a", "b"), ("c",)),))
    out = dce(merge_collectives(fn))
    assert [op.params["axes"] for op in out.ops] == [(("a", "b"), ("c",))]
    assert_same(fn, out)


def test_gathers_merge_only_when_the_inner_has_no_other_use():
    x = Value(_t(2, 4), "x")
    g1 = make_all_gather(x, (("b",), ()), MESH)
    g2 = make_all_gather(g1.results[0], (("a",), ()), MESH)
    fn = function([x], [g1, g2], g2.results, ((("a", "b"), ()),))
    out = dce(merge_collectives(fn))
    assert [op.params["axes"] for op in out.ops] == [(("a", "b"), ())]
    assert_same(fn, out)
    shared = function([x], [g1, g2], [g2.results[0], g1.results[0]], ((("a", "b"), ()),))
    assert merge_collectives(shared) is shared


def test_all_reduces_merge_in_mesh_order():
    x = Value(_t(4,), "x")
    r1 = make_all_reduce(x, ("c",))
    r2 = make_all_reduce(r1.results[0], ("a",))
    fn = function([x], [r1, r2], r2.results, ((("a",),),))
    out = dce(merge_collectives(fn))
    assert [(op.name, op.params["axes"]) for op in out.ops] == [(ALL_REDUCE, ("a", "c"))]
    assert_same(fn, out)
    r3 = make_all_reduce(r1.results[0], ("a",), "max")
    assert merge_collectives(function([x], [r1, r3], r3.results)).ops[1] is r3


def test_slice_of_gather_cancels_even_if_the_gather_is_shared():
    x = Value(_t(4, 4), "x")
    g = make_all_gather(x, (("a",), ()), MESH)
    s = make_all_slice(g.results[0], (("a",), ()), MESH)
    y = add(s.results[0], x)
    fn = function([x], [g, s, y], [y.results[0], g.results[0]], ((("a",), ()),),
                  ((("a",), ()), ((), ())))
    out = dce(cancel_gather_slice(fn))
    assert names(out) == [ALL_GATHER, "add"]
    assert out.ops[1].operands == [x, x]
    assert_same(fn, out)


def test_partial_cancellation_keeps_the_axes_that_differ():
    # x's dim 0 is split over (a, b); the gather undoes (a, b), the slice redoes (a, c):
    # only b needs gathering and c slicing.
    x = Value(_t(2, 4), "x")
    g = make_all_gather(x, (("a", "b"), ()), MESH)
    s = make_all_slice(g.results[0], (("a", "c"), ()), MESH)
    fn = function([x], [g, s], s.results, ((("a", "b"), ()),), ((("a", "c"), ()),))
    out = dce(cancel_gather_slice(fn))
    assert [(op.name, op.params["axes"]) for op in out.ops] == [
        (ALL_GATHER, (("b",), ())), (ALL_SLICE, (("c",), ()))]
    assert_same(fn, out)
    shared = function([x], [g, s], [s.results[0], g.results[0]], ((("a", "b"), ()),),
                      ((("a", "c"), ()), ((), ())))
    assert cancel_gather_slice(shared) is shared


def test_gather_then_slice_of_another_dim_is_an_all_to_all():
    x = Value(_t(4, 8), "x")
    g = make_all_gather(x, (("a", "b"), ()), MESH)
    s = make_all_slice(g.results[0], ((), ("b", "c")), MESH)
    fn = function([x], [g, s], s.results, ((("a", "b"), ()),), (((), ("b", "c")),))
    out = dce(fuse_all_to_all(fn))
    assert [op.name for op in out.ops] == [ALL_TO_ALL, ALL_GATHER, ALL_SLICE]
    a2a, rest_gather, rest_slice = out.ops
    assert (a2a.params["split_dim"], a2a.params["concat_dim"], a2a.params["axes"]) == (
        1, 0, ("b",))
    assert rest_gather.params["axes"] == (("a",), ())
    assert rest_slice.params["axes"] == ((), ("c",))
    assert count_collectives(out)["all_to_all"] == 1
    assert_same(fn, out)
    # Without axes in common, or with the gather used elsewhere, nothing changes.
    s2 = make_all_slice(g.results[0], ((), ("c",)), MESH)
    other = function([x], [g, s2], s2.results, ((("a", "b"), ()),), (((), ("c",)),))
    assert fuse_all_to_all(other) is other
    shared = function([x], [g, s], [s.results[0], g.results[0]], ((("a", "b"), ()),),
                      (((), ("b", "c")), ((), ())))
    assert fuse_all_to_all(shared) is shared


@pytest.mark.parametrize("reduced, x_sharding, slice_axes, expected", [
    (("a",), (("a",), ()), (("a",), ()), [(REDUCE_SCATTER, (("a",), ()))]),
    # b is reduced but not sliced: it stays an all_reduce.
    (("a", "b"), ((), ("b",)), (("a",), ()),
     [(ALL_REDUCE, ("b",)), (REDUCE_SCATTER, (("a",), ()))]),
    # c is sliced but not reduced: x is sliced first, so less data is reduced.
    (("a",), (("a",), ()), (("c",), ("a",)),
     [(ALL_SLICE, (("c",), ())), (REDUCE_SCATTER, ((), ("a",)))]),
], ids=["reduce_scatter", "reduce_more_than_scatter", "slice_first"])
def test_reduce_scatter(reduced, x_sharding, slice_axes, expected):
    x = Value(_t(8, 4), "x")
    r = make_all_reduce(x, reduced)
    s = make_all_slice(r.results[0], slice_axes, MESH)
    fn = function([x], [r, s], s.results, (x_sharding,), (slice_axes,))
    out = dce(fuse_reduce_scatter(fn))
    assert [(op.name, op.params["axes"]) for op in out.ops] == expected
    assert_same(fn, out)


def test_no_reduce_scatter_when_a_reduced_axis_is_major_to_a_sliced_one():
    x = Value(_t(8, 4), "x")
    r = make_all_reduce(x, ("a",))
    s = make_all_slice(r.results[0], (("a", "c"), ()), MESH)
    fn = function([x], [r, s], s.results, out_shardings=((("a", "c"), ()),))
    assert fuse_reduce_scatter(fn) is fn
    s2 = make_all_slice(r.results[0], (("a",), ()), MESH)
    shared = function([x], [r, s2], [s2.results[0], r.results[0]],
                      out_shardings=((("a",), ()), ((), ())))
    assert fuse_reduce_scatter(shared) is shared


def test_slice_of_a_reduce_scatter_on_another_dim_goes_first():
    x = Value(_t(8, 4), "x")
    rs = make_reduce_scatter(x, (("a",), ()), MESH)
    s = make_all_slice(rs.results[0], ((), ("b",)), MESH)
    fn = function([x], [rs, s], s.results, out_shardings=((("a",), ("b",)),))
    out = dce(slice_before_reduce_scatter(fn))
    assert [(op.name, op.params["axes"]) for op in out.ops] == [
        (ALL_SLICE, ((), ("b",))), (REDUCE_SCATTER, (("a",), ()))]
    assert_same(fn, out)
    # on the scatter's dimension the slice's axis would become major: no rewrite
    same_dim = make_all_slice(rs.results[0], (("b",), ()), MESH)
    kept = function([x], [rs, same_dim], same_dim.results, out_shardings=((("a", "b"), ()),))
    assert slice_before_reduce_scatter(kept) is kept


def test_one_sweep_sees_its_own_rewrites():
    """slice_model(slice_batch(all_reduce_batch(gather_model(x)))): the inner slice fuses
    with the reduction, then the outer slice goes before the reduce_scatter and cancels
    the gather, all in one round: what a tied embedding's gradient lowers to."""
    x = Value(_t(8, 2), "x")
    g = make_all_gather(x, ((), ("b",)), MESH)
    r = make_all_reduce(g.results[0], ("a",))
    s1 = make_all_slice(r.results[0], (("a",), ()), MESH)
    s2 = make_all_slice(s1.results[0], ((), ("b",)), MESH)
    fn = function([x], [g, r, s1, s2], s2.results, (((), ("b",)),),
                  ((("a",), ("b",)),))
    out = optimize(fn)
    assert [(op.name, op.params["axes"]) for op in out.ops] == [
        (REDUCE_SCATTER, (("a",), ()))], print_hlo(out)
    assert_same(fn, out)


@pytest.mark.parametrize("prim, monoid", [(lax.add_p, "add"), (lax.max_p, "max")])
def test_two_reductions_combined_reduce_once(prim, monoid):
    x, y = Value(_t(4, 4), "x"), Value(_t(4, 4), "y")
    rx = make_all_reduce(x, ("a", "b"), monoid)
    ry = make_all_reduce(y, ("b", "a"), monoid)
    z = add(rx.results[0], ry.results[0], prim=prim)
    fn = function([x, y], [rx, ry, z], z.results, ((("c",), ()), ((), ("a",))),
                  ((("c",), ()),))
    out = dce(reassociate_reductions(fn))
    assert names(out) == [prim.name, ALL_REDUCE]
    assert_same(fn, out)
    wrong = add(rx.results[0], ry.results[0], prim=lax.min_p)
    assert reassociate_reductions(function([x, y], [rx, ry, wrong], wrong.results)).ops[2] \
        is wrong


@pytest.mark.parametrize("inner_first", [True, False])
def test_partial_sums_added_one_at_a_time_to_a_replicated_value_reduce_once(inner_first):
    # add_any(add_any(r, s1), s2), how autodiff accumulates a value's cotangents.
    r, x, y = Value(_t(4, 4), "r"), Value(_t(4, 4), "x"), Value(_t(4, 4), "y")
    rx, ry = make_all_reduce(x, ("a",)), make_all_reduce(y, ("a",))
    inner = add(r, rx.results[0]) if inner_first else add(rx.results[0], r)
    outer = add(inner.results[0], ry.results[0], "z", prim=add_jaxvals_p)
    fn = function([r, x, y], [rx, inner, ry, outer], outer.results)
    out = dce(reassociate_reductions(fn))
    assert names(out) == ["add_any", ALL_REDUCE, "add_any"], print_hlo(out)
    assert out.results[0].name == "z"
    assert_same(fn, out)
    # A partial sum with another use keeps its own reduction.
    fn = function([r, x, y], [rx, inner, ry, outer], [outer.results[0], rx.results[0]])
    assert names(dce(reassociate_reductions(fn))).count(ALL_REDUCE) == 2


def test_arguments_sliced_the_same_way_arrive_sliced():
    x, w = Value(_t(8, 4), "x"), Value(_t(8, 4), "w")
    s1 = make_all_slice(x, (("a",), ()), MESH)
    s2 = make_all_slice(x, (("a",), ("b",)), MESH)
    s3 = make_all_slice(w, (("a",), ()), MESH)
    g = make_all_gather(s2.results[0], ((), ("b",)), MESH)
    y = add(s1.results[0], g.results[0])
    z = add(y.results[0], s3.results[0])
    u = add(w, w)  # w is also used whole: it stays replicated
    fn = function([x, w], [s1, s2, s3, g, y, z, u], [z.results[0], u.results[0]],
                  out_shardings=((("a",), ()), ((), ())))
    out = dce(localize_arguments(fn))
    assert out.attributes["in_shardings"] == ((("a",), ()), ((), ()))
    assert out.args[0].type == _t(4, 4) and out.args[1] is w
    assert [(op.name, op.params.get("axes")) for op in out.ops][:2] == [
        (ALL_SLICE, ((), ("b",))), (ALL_SLICE, (("a",), ()))]
    assert_same(fn, out)


def test_gathered_results_become_device_local():
    x = Value(_t(8, 4), "x")
    y = add(x, x, "y")
    g = make_all_gather(y.results[0], (("a",), ("b",)), MESH)
    fn = function([x], [y, g], [g.results[0], g.results[0]], ((("a",), ("b",)),))
    out = localize_results(fn)
    assert out.results == [y.results[0], y.results[0]]
    assert out.attributes["out_shardings"] == ((("a",), ("b",)),) * 2
    assert names(dce(out)) == ["add"]
    assert_same(fn, out)


def test_cse_and_demand_order():
    x = Value(_t(8, 4), "x")
    s1 = make_all_slice(x, (("a",), ()), MESH)
    s2 = make_all_slice(x, (("a",), ()), MESH)
    dead = add(x, x, "dead")
    y = add(s1.results[0], s2.results[0], "y")
    fn = function([x], [s1, dead, s2, y], y.results, out_shardings=((("a",), ()),))
    out = cse(fn)
    assert out.ops[-1].operands == [s1.results[0], s1.results[0]]
    ordered = schedule_by_demand(out)
    assert names(ordered) == [ALL_SLICE, "add"] and ordered.ops[0] is s1
    assert_same(fn, ordered)


def test_optimize_reaches_a_fixed_point_across_passes():
    """The lowering's pattern for a gradient: #sum over a, #tile over b on dim 1 and a
    gather to replicate it, consumed by an update sliced over (a on dim 0, b on dim 1):
    the slice cancels the gather on b and fuses with the reduction over a."""
    g = Value(_t(8, 2), "g")
    w = Value(_t(8, 4), "w")
    r = make_all_reduce(g, ("a",))
    gathered = make_all_gather(r.results[0], ((), ("b",)), MESH)
    gs = make_all_slice(gathered.results[0], (("a",), ("b",)), MESH)
    ws = make_all_slice(w, (("a",), ("b",)), MESH)
    new = add(ws.results[0], gs.results[0], "new")
    back = make_all_gather(new.results[0], (("a",), ("b",)), MESH)
    fn = function([g, w], [r, gathered, gs, ws, new, back], back.results,
                  (((), ("b",)), ((), ())))
    out = optimize(fn)
    assert [op.name for op in out.ops] == [REDUCE_SCATTER, "add"], print_hlo(out)
    assert out.attributes["in_shardings"] == (((), ("b",)), (("a",), ("b",)))
    assert out.attributes["out_shardings"] == ((("a",), ("b",)),)
    assert_same(fn, out)


def test_a_reduction_over_other_axes_than_a_gather_goes_first():
    """all_reduce<a>(all_gather<b>(x)): the reduction moves the ungathered value and the
    gather comes last, where the result leaves it to the caller (a Megatron weight's
    gradient under batch parallelism)."""
    x = Value(_t(4, 4), "x")
    g = make_all_gather(x, (("b",), ()), MESH)
    r = make_all_reduce(g.results[0], ("a",))
    fn = function([x], [g, r], r.results, ((("b",), ()),))
    out = dce(reduce_before_gather(fn))
    assert [(op.name, op.params["axes"]) for op in out.ops] == [
        (ALL_REDUCE, ("a",)), (ALL_GATHER, (("b",), ()))]
    assert out.ops[0].operands == [x]
    assert_same(fn, out)
    local = optimize(fn)
    assert names(local) == [ALL_REDUCE]
    assert local.attributes["out_shardings"] == ((("b",), ()),)
    assert_same(fn, local)
    # Over a gathered axis the reduction does not commute; a shared gather stays.
    over_b = make_all_reduce(g.results[0], ("a", "b"))
    kept = function([x], [g, over_b], over_b.results, ((("b",), ()),))
    assert reduce_before_gather(kept) is kept
    shared = function([x], [g, r], [r.results[0], g.results[0]], ((("b",), ()),))
    assert reduce_before_gather(shared) is shared


def test_a_reduction_a_slice_scatters_stays_after_the_gather():
    """all_slice<a>(all_reduce<a>(all_gather<b>(x))) is a reduce_scatter of the gathered
    value, which moves less than the reduction moved before the gather would (a
    layer-norm scale's gradient under BP+MP+Z3+EMB)."""
    x = Value(_t(4, 4), "x")
    g = make_all_gather(x, (("b",), ()), MESH)
    r = make_all_reduce(g.results[0], ("a",))
    s = make_all_slice(r.results[0], (("a",), ()), MESH)
    fn = function([x], [g, r, s], s.results, ((("b",), ()),), ((("a",), ()),))
    assert reduce_before_gather(fn) is fn
    local = optimize(fn)
    assert names(local) == [ALL_GATHER, REDUCE_SCATTER]
    assert_same(fn, local)


def test_a_transpose_of_a_gather_goes_first():
    x = Value(_t(4, 2), "x")
    g = make_all_gather(x, (("b",), ("c",)), MESH)
    t = Op("transpose", g.results, [Value(_t(4, 8))], {"permutation": (1, 0)},
           prim=lax.transpose_p)
    r = make_all_reduce(t.results[0], ("a",))
    fn = function([x], [g, t, r], r.results, ((("b",), ("c",)),))
    out = dce(transpose_before_gather(fn))
    assert [op.name for op in out.ops] == ["transpose", ALL_GATHER, ALL_REDUCE]
    assert out.ops[1].params["axes"] == (("c",), ("b",))
    assert_same(fn, out)
    local = optimize(fn)
    assert names(local) == ["transpose", ALL_REDUCE]
    assert local.attributes["out_shardings"] == ((("c",), ("b",)),)
    assert_same(fn, local)


def test_the_local_rewrites_run_inside_a_loops_body():
    """A body is a device-local program too: a gather on one dimension sliced again on
    another is an all_to_all there, each time the body runs."""
    c = Value(_t(4, 8), "c")
    body_ops = []

    def emit(op: Op) -> Value:
        body_ops.append(op)
        return op.results[0]

    moved = emit(make_all_slice(emit(make_all_gather(c, (("a",), ()), MESH)), ((), ("a",)),
                                MESH))
    negated = emit(Op("neg", [moved], [Value(moved.type)], prim=lax.neg_p))
    back = emit(make_all_slice(emit(make_all_gather(negated, ((), ("a",)), MESH)),
                               (("a",), ()), MESH))
    x = Value(_t(4, 8), "x")
    loop = Op("scan", [x], [Value(x.type, "y")],
              {"length": 3, "num_consts": 0, "num_carry": 1, "reverse": False, "unroll": 1,
               "linear": (False,), "jaxpr": None, "_split_transpose": False},
              regions=[Region([c], body_ops, [back])])
    before = function([x], [loop], loop.results, in_shardings=((("a",), ()),),
                      out_shardings=((("a",), ()),))
    after = optimize(before)
    (body,) = after.ops[0].regions
    assert [op.name for op in body.ops] == [ALL_TO_ALL, "neg", ALL_TO_ALL]
    assert count_collectives(after, executed=True)["all_to_all"] == 6
    assert_same(before, after)
