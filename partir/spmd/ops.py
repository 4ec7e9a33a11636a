"""PartIR:SPMD ops: `spmd.execute`, `spmd.tile_reduce`, `spmd.redistribute`, with the
paper's syntax (lst:SPMD-tiled-chain-matmul) and typing rules TExec, TTileRed, TRedist.

    %r = spmd.execute "a" "b"
        (%x1: dtensor<{}, [{"a"}256,{"b"}8]>)
        (%ra: range<4>, %rb: range<2>, %y1: tensor<64x4xf32>) {
      ...Core ops without loops...
      yield %v : tensor<64x4xf32>
    } : dtensor<{"a","b"}, [64,4]>
    %s = spmd.tile_reduce [#sum<"b">] %r : dtensor<{"a"}, [64,4]>
    %t = spmd.redistribute %s -> dtensor<{"a"}, [{"b"}64,4]>

Every op carries the mesh in its parameters: its type rule needs the axis sizes (local
types, the size a #tile multiplies by), and type rules see only the op.
"""

from __future__ import annotations

import math

from partir.core.actions import Action, Sum, Tile
from partir.core.dialect import LOOP
from partir.ir import Op, RangeType, Region, TensorType, Value
from partir.ir.printer import Printer, register_op_printer
from partir.ir.types import tile_size
from partir.ir.verifier import register_type_rule
from partir.mesh import Mesh
from partir.rules.catalogue import data_flow
from partir.spmd.types import DTensorType, data_equivalent

EXECUTE = "spmd.execute"
TILE_REDUCE = "spmd.tile_reduce"
REDISTRIBUTE = "spmd.redistribute"
SPMD_OPS = (EXECUTE, TILE_REDUCE, REDISTRIBUTE)


def make_execute(axes: tuple[str, ...], mesh: Mesh, operands: list[Value], ranges: list[Value],
                 locals_: list[Value], body: list[Op], yields: list[Value],
                 results: list[Value]) -> Op:
    """`execute axes (operands) (ranges, locals_) {body; yield yields}`: the body runs on
    every device of the axes, with each operand's local tensor bound to its local."""
    return Op(EXECUTE, list(operands), list(results), {"axes": tuple(axes), "mesh": mesh},
              regions=[Region([*ranges, *locals_], list(body), list(yields))])


def make_tile_reduce(x: Value, axis: str, action: Action, mesh: Mesh, result: Value) -> Op:
    return Op(TILE_REDUCE, [x], [result], {"axis": axis, "action": action, "mesh": mesh})


def make_redistribute(x: Value, mesh: Mesh, result: Value) -> Op:
    return Op(REDISTRIBUTE, [x], [result], {"mesh": mesh})


def format_action(axis: str, action: Action) -> str:
    if isinstance(action, Tile):
        return f'#tile<"{axis}", {action.dim}>'
    if isinstance(action, Sum):
        return f'#sum<"{axis}">' if action.monoid == "add" else f'#sum<"{axis}", {action.monoid}>'
    return f'any<"{axis}">'


def tile_reduce_type(t: DTensorType, axis: str, action: Action, mesh: Mesh,
                     size: int | None = None) -> DTensorType:
    """tilered(sigma, mu): the action consumes the last stacked axis. #tile<a, d> views the
    local tensors stacked on a as tiles of dimension d, so a becomes d's major axis (each
    a-slice is a whole tile of d, already split over d's other axes) and d grows by a's
    size; #sum<a> and any<a> leave the value replicated on a.

    `size` is d's global size when the tiles pad it (a's size does not divide it): any
    size whose tiles on d's axes are the local tensors' (ValueError otherwise)."""
    if not t.stacked or t.stacked[-1] != axis:
        raise ValueError(f"{format_action(axis, action)} must act on the last stacked axis "
                         f"of {t}")
    stacked = t.stacked[:-1]
    if not isinstance(action, Tile):
        return DTensorType(stacked, t.dims, t.dtype)
    if not 0 <= action.dim < t.rank:
        raise ValueError(f"{format_action(axis, action)} names a dimension {t} does not have")
    dims = list(t.dims)
    axes, n = dims[action.dim]
    whole = n * mesh[axis]
    if size is not None and size != whole:
        parts = math.prod(mesh[a] for a in axes)
        if size <= 0 or tile_size(size, parts * mesh[axis]) != tile_size(n, parts):
            raise ValueError(f"{format_action(axis, action)} of {t}: the tiled dimension "
                             f"should be of size {whole}, or of a size its tiles pad to "
                             f"{whole}, not {size}")
        whole = size
    dims[action.dim] = ((axis, *axes), whole)
    return DTensorType(stacked, tuple(dims), t.dtype)


# --- printers -------------------------------------------------------------------------------


def _typed(p: Printer, values: list[Value]) -> str:
    return ", ".join(f"{p.ref(v)}: {v.type}" for v in values)


@register_op_printer(EXECUTE)
def _print_execute(p: Printer, op: Op, depth: int) -> None:
    region = op.regions[0]
    axes = "".join(f' "{a}"' for a in op.params["axes"])
    p.emit(depth, f"{p.results_prefix(op)}spmd.execute{axes}")
    p.emit(depth + 2, f"({_typed(p, op.operands)})")
    p.emit(depth + 2, f"({_typed(p, region.args)}) {{")
    p.print_region_body(region, depth + 1)
    p.emit(depth, f"}} : {p.result_types(op)}")


@register_op_printer(TILE_REDUCE)
def _print_tile_reduce(p: Printer, op: Op, depth: int) -> None:
    action = format_action(op.params["axis"], op.params["action"])
    p.emit(depth, f"{p.results_prefix(op)}spmd.tile_reduce [{action}] {p.ref(op.operands[0])}"
                  f" : {p.result_types(op)}")


@register_op_printer(REDISTRIBUTE)
def _print_redistribute(p: Printer, op: Op, depth: int) -> None:
    p.emit(depth, f"{p.results_prefix(op)}spmd.redistribute {p.ref(op.operands[0])}"
                  f" -> {p.result_types(op)}")


# --- typing rules ---------------------------------------------------------------------------


def _check_operand(t: object, axes: tuple[str, ...], mesh: Mesh) -> str | None:
    """An execute operand may be a tensor (the same on every device) or a dtensor whose
    stacked axes are a prefix of the execute's axes (the body on device i reads the local
    tensor stacked at i's first coordinates) and whose dimensions are distributed only over
    the execute's axes (otherwise devices the result does not stack would differ)."""
    if isinstance(t, TensorType):
        return None
    if not isinstance(t, DTensorType):
        return f"operand of type {t} is neither a tensor nor a dtensor"
    msg = t.check(mesh)
    if msg:
        return msg
    if t.stacked != axes[:len(t.stacked)]:
        return f"stacked axes of operand {t} are not a prefix of the execute's axes {axes}"
    if not set(t.axes) <= set(axes):
        return f"operand {t} is distributed over axes the execute does not span {axes}"
    return None


def _body_error(region: Region) -> str | None:
    """The body is a Core expression without loops, closed over the region's arguments
    (control flow, whose regions are closed, included)."""
    bound = set(region.args)
    for op in region.ops:
        if (op.regions and data_flow(op) is None) or op.name == LOOP or \
                op.name in SPMD_OPS:
            return f"the body may hold only Core ops without loops, found {op.name}"
        for v in op.operands:
            if v not in bound:
                return (f"{op.name} in the body uses %{v.name or v.id}, which is not an argument"
                        " of the execute")
        bound.update(op.results)
    for v in region.yields:
        if v not in bound:
            return f"the body yields %{v.name or v.id}, which is not an argument of the execute"
    return None


@register_type_rule(EXECUTE)
def _execute_type(op: Op) -> str | None:
    """TExec."""
    axes, mesh = op.params["axes"], op.params["mesh"]
    region = op.regions[0]
    if len(set(axes)) != len(axes) or not set(axes) <= set(mesh):
        return f"axes {axes} must be distinct axes of the mesh {mesh}"
    if len(region.args) != len(axes) + len(op.operands):
        return "the body needs one range per axis and one local tensor per operand"
    for a, r in zip(axes, region.args, strict=False):
        if r.type != RangeType(a, mesh[a]):
            return f"the range of axis {a!r} must be range<{mesh[a]}>, got {r.type}"
    for x, y in zip(op.operands, region.args[len(axes):], strict=True):
        msg = _check_operand(x.type, axes, mesh)
        if msg:
            return msg
        want = x.type.local_type(mesh) if isinstance(x.type, DTensorType) else x.type
        if y.type != want:
            return f"local of operand {x.type} must have type {want}, got {y.type}"
    msg = _body_error(region)
    if msg:
        return msg
    if len(op.results) != len(region.yields):
        return "an execute needs one result per yielded value"
    for r, y in zip(op.results, region.yields, strict=True):
        if not isinstance(y.type, TensorType):
            return f"the body must yield tensors, got {y.type}"
        want = DTensorType.of(y.type, axes)
        if r.type != want:
            return f"result {r.type} should be {want}"
    return None


@register_type_rule(TILE_REDUCE)
def _tile_reduce_type(op: Op) -> str | None:
    """TTileRed."""
    (x,), (r,) = op.operands, op.results
    if not isinstance(x.type, DTensorType):
        return f"tile_reduce needs a dtensor with stacked axes, got {x.type}"
    msg = x.type.check(op.params["mesh"])
    if msg:
        return msg
    action = op.params["action"]
    size = None
    if (isinstance(action, Tile) and isinstance(r.type, DTensorType)
            and 0 <= action.dim < r.type.rank):
        size = r.type.dims[action.dim][1]
    try:
        want = tile_reduce_type(x.type, op.params["axis"], action, op.params["mesh"], size)
    except ValueError as e:
        return str(e)
    if r.type != want:
        return f"result {r.type} should be {want}"
    return None


@register_type_rule(REDISTRIBUTE)
def _redistribute_type(op: Op) -> str | None:
    """TRedist."""
    (x,), (r,) = op.operands, op.results
    if not isinstance(r.type, DTensorType | TensorType):
        return f"redistribute must produce a dtensor or a tensor, got {r.type}"
    if isinstance(r.type, DTensorType):
        msg = r.type.check(op.params["mesh"])
        if msg:
            return msg
    if not isinstance(x.type, DTensorType | TensorType) or not data_equivalent(x.type, r.type):
        return f"{x.type} and {r.type} do not distribute the same data"
    return None
