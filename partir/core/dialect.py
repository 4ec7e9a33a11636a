"""PartIR:Core ops in the IR: `loop`, `slice`, `index` and `tag`, with their syntax and
typing.

Op names carry the dialect prefix (`core.loop`, `core.slice`) because JAX has primitives
of the same names (`slice` is `lax.slice`); `tag` is the frontend's primitive itself,
named `partir.tag` (partir.ir.opnames). All print as the paper's bare words.

    %r = loop "B" [#tile<0>] (%rB: range<4>) { ...; yield %v : tensor<64x8xf32> }
    %s = slice 0 %x[%rB] : tensor<64x8xf32>
    %iB = index %rB : tensor<i32>
    %t = tag "name" %x : tensor<...>

`index` is the loop's iteration number as an int32 scalar: the only way a loop body reads
its position besides `slice`. Materialization emits it, and ordinary primitives computing
tile offsets from it, where a tile's local computation depends on where the tile lies
(iota along a tiled dimension, a gather from a sliced table, ...).
"""

from __future__ import annotations

import numpy as np

from partir.core.actions import AnyAction, Sum, Tile
from partir.ir import Op, RangeType, Region, TensorType, Value
from partir.ir.opnames import CONSTANT, TAG
from partir.ir.printer import Printer, format_param, register_op_printer
from partir.ir.types import tile_size
from partir.ir.verifier import register_type_rule

LOOP = "core.loop"
SLICE = "core.slice"
INDEX = "core.index"
INDEX_TYPE = TensorType((), np.dtype("int32"))


def make_loop(axis: str, size: int, actions: tuple, body: list[Op], yields: list[Value],
              results: list[Value], range_value: Value) -> Op:
    return Op(LOOP, [], results, {"axis": axis, "size": size, "actions": tuple(actions)},
              regions=[Region([range_value], body, yields)])


def make_slice(x: Value, dim: int, r: Value, result: Value) -> Op:
    return Op(SLICE, [x, r], [result], {"dim": dim})


def make_index(r: Value, name: str | None = None) -> Op:
    """The iteration number of the loop whose range is r."""
    return Op(INDEX, [r], [Value(INDEX_TYPE, name)], {})


def sliced_type(t: TensorType, dim: int, n: int) -> TensorType:
    shape = list(t.shape)
    shape[dim] = tile_size(shape[dim], n)
    return t.with_shape(tuple(shape))


@register_op_printer(LOOP)
def _print_loop(p: Printer, op: Op, depth: int) -> None:
    region = op.regions[0]
    (r,) = region.args
    actions = ", ".join(map(str, op.params["actions"]))
    p.emit(depth, f'{p.results_prefix(op)}loop "{op.params["axis"]}" [{actions}] '
                  f"({p.ref(r)}: {r.type}) {{")
    p.print_region_body(region, depth + 1)
    p.emit(depth, f"}} : {p.result_types(op)}")


@register_op_printer(SLICE)
def _print_slice(p: Printer, op: Op, depth: int) -> None:
    x, r = op.operands
    p.emit(depth, f"{p.results_prefix(op)}slice {op.params['dim']} {p.ref(x)}[{p.ref(r)}]"
                  f" : {p.result_types(op)}")


@register_op_printer(INDEX)
def _print_index(p: Printer, op: Op, depth: int) -> None:
    p.emit(depth, f"{p.results_prefix(op)}index {p.ref(op.operands[0])} : "
                  f"{p.result_types(op)}")


@register_op_printer(TAG)
def _print_tag(p: Printer, op: Op, depth: int) -> None:
    p.emit(depth, f'{p.results_prefix(op)}tag "{op.params["name"]}" {p.ref(op.operands[0])}'
                  f" : {p.result_types(op)}")


@register_op_printer(CONSTANT)
def _print_constant(p: Printer, op: Op, depth: int) -> None:
    p.emit(depth, f"{p.results_prefix(op)}constant {format_param(op.params['value'])}"
                  f" : {p.result_types(op)}")


@register_type_rule(SLICE)
def _slice_type(op: Op) -> str | None:
    x, r = op.operands
    if not isinstance(r.type, RangeType):
        return f"slice index must be a range, got {r.type}"
    dim = op.params["dim"]
    if not 0 <= dim < x.type.rank:
        return f"slice dimension {dim} out of range for {x.type}"
    want = sliced_type(x.type, dim, r.type.size)
    if op.results[0].type != want:
        return f"result {op.results[0].type} should be {want}"
    return None


@register_type_rule(INDEX)
def _index_type(op: Op) -> str | None:
    if len(op.operands) != 1 or not isinstance(op.operands[0].type, RangeType):
        return "index takes one range operand"
    if op.results[0].type != INDEX_TYPE:
        return f"result {op.results[0].type} should be {INDEX_TYPE}"
    return None


@register_type_rule(LOOP)
def _loop_type(op: Op) -> str | None:
    region = op.regions[0]
    (r,) = region.args
    n = op.params["size"]
    if not isinstance(r.type, RangeType) or r.type.size != n:
        return f"loop index must be range<{n}>, got {r.type}"
    actions = op.params["actions"]
    if not (len(actions) == len(op.results) == len(region.yields)):
        return "a loop needs one action and one yielded value per result"
    for a, res, y in zip(actions, op.results, region.yields, strict=True):
        if isinstance(a, Tile):
            # The iterations' tiles concatenated, truncated to the result's size when the
            # axis does not divide it (the tiles of a padded dimension).
            if (not 0 <= a.dim < y.type.rank or res.type.rank != y.type.rank
                    or tile_size(res.type.shape[a.dim], n) != y.type.shape[a.dim]):
                return f"result {res.type} does not match {a} of yielded {y.type}"
            shape = list(y.type.shape)
            shape[a.dim] = res.type.shape[a.dim]
            want = y.type.with_shape(tuple(shape))
        elif isinstance(a, Sum | AnyAction):
            want = y.type
        else:
            return f"unknown loop action {a!r}"
        if res.type != want:
            return f"result {res.type} does not match {a} of yielded {y.type}"
    return None


@register_type_rule(TAG)
def _tag_type(op: Op) -> str | None:
    if op.results[0].type != op.operands[0].type:
        return "tag must not change the type"
    return None
