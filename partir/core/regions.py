"""Control-flow ops in the Core module: a control-flow op becomes its `partir.enter`, its
regions' ops, and its `partir.exit` (`partir.rules.edges`), in program order, so that every
pass sees a body's ops as ops of the program.

Orders keep each region's ops together, after the op's enter and before its exit: the op
at position j of a sequence with order prefix P has enter (P, j, 0), region r's ops
(P, j, 1 + r, ...) and exit (P, j, 1 + R). An identity op inserted on a value sorts right
after the value's definition (`CoreModule.insert_identity`), so inside the region of the
value's producer: an identity on an argument sorts after the enter and before the body.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from partir.core.actions import ANY, AnyAction, Loop, Sum, Tile
from partir.core.program import CoreOp, CoreProgram, Nest
from partir.errors import NotShardableError
from partir.ir import Location, Op, Region, Value
from partir.ir.types import tile_size
from partir.mesh import Mesh
from partir.rules.catalogue import data_flow
from partir.rules.edges import EDGE_OPS, ENTER, EXIT, by_value, edge_ops

_uids = itertools.count(1 << 40)  # restructured ops: apart from the module's uids


def next_uid() -> int:
    return next(_uids)


@dataclass(frozen=True)
class FlatOp:
    """One op of the flattened program, with its order and, per result available only
    later (a carry's after the loop), the order it is available after."""

    order: tuple[int, ...]
    name: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    params: Any
    loc: Location
    prim: Any = None
    available: tuple[tuple[int, ...] | None, ...] = ()


def flat_ops(ops: Sequence[Op], prefix: tuple[int, ...] = ()) -> Iterator[FlatOp]:
    """The ops in program order, each control-flow op as its enter, its regions' ops
    (flattened in turn) and its exit."""
    for j, op in enumerate(ops):
        flow = data_flow(op)
        if flow is None:
            yield FlatOp((*prefix, j), op.name, tuple(op.operands), tuple(op.results),
                         op.params, op.loc, op.prim)
            continue
        enters, exits = edge_ops(op, flow)
        after = (*prefix, j, 1 + len(op.regions), -1)  # past the regions, before the exits
        for q, e in enumerate(enters):
            yield FlatOp((*prefix, j, 0, q), e.name, e.operands, e.results,
                         {"of": op, "edge": e.edge}, op.loc,
                         available=tuple(after if r in op.results else None
                                         for r in e.results))
        for r, region in enumerate(op.regions):
            yield from flat_ops(region.ops, (*prefix, j, 1 + r))
        for q, e in enumerate(exits):
            yield FlatOp((*prefix, j, 1 + len(op.regions), q), e.name, e.operands,
                         e.results, {"of": op, "edge": e.edge}, op.loc)


# --- back to structured control flow, after propagation --------------------------------


def structured(program: CoreProgram) -> CoreProgram:
    """The program with its control-flow ops restructured (`restructure`), if flattened;
    once per program (kept beside it, as its cached properties are)."""
    found = program.__dict__.get("_structured")
    if found is None:
        found = (restructure(program) if any(op.name in EDGE_OPS for op in program.ops)
                 else program)
        program.__dict__["_structured"] = found
    return found


# How a region's program becomes the device-local region of its op (`lower_region`):
# lowering it through every stage, which live after this one (`partir.pipeline` sets it).
_region_lowering: list[Callable[[CoreProgram], Region]] = []


def set_region_lowering(lowering: Callable[[CoreProgram], Region]) -> None:
    _region_lowering[:] = [lowering]


def lower_region(program: CoreProgram) -> Region:
    """The device-local region a region's program lowers to."""
    if not _region_lowering:
        raise RuntimeError("no region lowering is set: import partir.pipeline")
    return _region_lowering[0](program)


def restructure(program: CoreProgram) -> CoreProgram:
    """The structured program of a flattened one: each control-flow op again one op, its
    regions programs of their own (parameter `BODIES`: a `CoreProgram` per region, its
    arguments arriving as the op's enter edges lay them out (`in_constraints`) and its
    results leaving as its edges take them (`out_constraints`)), the op looped over every
    axis its edges slice: each operand as its edge slices it, each result as its edge
    tiles it, `any` where the edge leaves it whole (the region makes it alike on every
    device). Its regions are lowered as programs of their own (`partir.pipeline`)."""
    nests = dict(program.nests)
    ops = _level(list(program.ops), nests, program.mesh)
    return replace(program, ops=tuple(ops), nests=nests)


def _level(ops: list[CoreOp], nests: dict[int, Nest], mesh: Mesh) -> list[CoreOp]:
    """The ops of one level (a program's or a region's), each control-flow op's group of
    edges, body ops and identities made one op."""
    # Every control-flow op has an edge (one without operands, a cond of constants, has
    # its exits): its prefix (P, j) is its edges' orders but their last two places.
    edges = {op.order[:-2]: op.params["of"] for op in ops if op.name in EDGE_OPS}
    controls = {p: of for p, of in edges.items()
                if not any(p[:n] in edges for n in range(1, len(p)))}  # this level's
    lengths = sorted({len(p) for p in controls})
    out: list[CoreOp] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        prefix = next((op.order[:n] for n in lengths if op.order[:n] in controls), None)
        if prefix is None:
            out.append(op)
            i += 1
            continue
        j = i
        while j < len(ops) and ops[j].order[:len(prefix)] == prefix:
            j += 1
        control, after = _control(controls[prefix], prefix, ops[i:j], nests, mesh)
        out.append(control)
        out += after
        i = j
    return out


def _control(of: Op, prefix: tuple[int, ...], group: list[CoreOp], nests: dict[int, Nest],
             mesh: Mesh) -> tuple[CoreOp, list[CoreOp]]:
    """The control-flow op `of` from its group of flattened ops, and the ops that follow
    it at its level (identities on its results)."""
    n_regions = len(of.regions)
    at = len(prefix)
    enters = [op for op in group if op.name == ENTER and op.params["of"] is of
              and op.order[at] == 0]
    exits = [op for op in group if op.name == EXIT and op.params["of"] is of]
    for op in (*enters, *exits):
        if op.uid in nests:
            nests[op.uid] = _laid_out(nests[op.uid], op, mesh)
    region_of = {a: r for r, region in enumerate(of.regions) for a in region.args}
    bodies: list[list[CoreOp]] = [[] for _ in range(n_regions)]
    after: list[CoreOp] = []
    edges = {*enters, *exits}
    for op in group:
        if op in edges:
            continue
        place = op.order[at]
        if place == 0:  # an identity on an argument: the start of its region
            bodies[region_of[op.operands[0]]].append(op)
        elif place <= n_regions:
            bodies[place - 1].append(op)
        else:  # an identity on a result
            after.append(op)
    flow = data_flow(of)
    # Per operand: its enter op; per result: (edge op, its result position there).
    by_operand: dict[int, CoreOp] = {}
    by_result: dict[int, tuple[CoreOp, int]] = {}
    # Per region and yield position: (edge op, its operand position there).
    by_yield: dict[tuple[int, int], tuple[CoreOp, int]] = {}
    exits_of = by_value(flow.exits)
    for op in enters:
        kind, n = op.params["edge"]
        if kind == "carry":
            carry = flow.carries[n]
            by_operand[carry.operand] = op
            by_result[carry.result] = (op, len(op.results) - 1)
            by_yield[carry.made] = (op, 1)
        else:
            by_operand[n] = op
    for op in exits:
        _, k = op.params["edge"]
        by_result[k] = (op, 0)
        for position, e in enumerate(exits_of[k]):
            by_yield[(e.region, e.position)] = (op, position)
    axes = _axes_of([*enters, *exits], nests, mesh)
    operands = [by_operand[i].operands[0] if i in by_operand else v
                for i, v in enumerate(of.operands)]
    loops = []
    for axis in axes:
        dims = tuple(_sliced(nests, by_operand[i], 0, axis) if i in by_operand else None
                     for i in range(len(of.operands)))
        actions = tuple(_action(nests, *by_result[k], axis) for k in range(len(of.results)))
        loops.append(Loop(axis, actions, dims))
    programs = []
    for r, region in enumerate(of.regions):
        args_in = tuple(_tiling(nests, *_producer_of(a, enters), a.type.rank)
                        for a in region.args)
        results, outs = [], []
        for p, y in enumerate(region.yields):
            edge = by_yield.get((r, p))
            if edge is None:  # a while loop's predicate: every device decides alike
                results.append(y)
                outs.append(((),) * y.type.rank)
                continue
            op, position = edge
            results.append(op.operands[position])
            outs.append(_slicing(nests, op, position, y.type.rank))
        body = _level(bodies[r], nests, mesh)
        programs.append(CoreProgram(
            f"{of.name}_region{r}", mesh, tuple(region.args), tuple(body),
            {op.uid: nests[op.uid] for op in body if op.uid in nests}, tuple(results),
            tuple(f"yield/{p}" for p in range(len(results))), tuple(outs), args_in))
    control = CoreOp(next_uid(), of.name, tuple(operands), tuple(of.results),
                     {**of.params, BODIES: tuple(programs)}, of.loc, of.prim, order=prefix,
                     regions=tuple(of.regions))
    if loops:
        nests[control.uid] = tuple(loops)
    return control, after


BODIES = "_region_programs"  # a restructured control-flow op's regions, as programs


def _axes_of(edges: list[CoreOp], nests: dict[int, Nest], mesh: Mesh) -> list[str]:
    """The axes the edges loop over, outermost first: where an edge slices or tiles one
    dimension over several, in its order (major to minor), else in order of appearance.
    An axis of size 1 slices nothing, so its place among the others does not matter."""
    axes: list[str] = []
    before: set[tuple[str, str]] = set()  # (a, b): a must be outside b
    for op in edges:
        nest = nests.get(op.uid, ())
        for lp in nest:
            if lp.axis not in axes:
                axes.append(lp.axis)
        for outer, inner in itertools.combinations(nest, 2):
            if mesh[outer.axis] == 1 or mesh[inner.axis] == 1:
                continue
            if (any(a is not None and a == b for a, b in zip(outer.operands, inner.operands,
                                                              strict=True))
                    or any(isinstance(a, Tile) and a == b
                           for a, b in zip(outer.results, inner.results, strict=True))):
                before.add((outer.axis, inner.axis))
    ordered: list[str] = []
    while axes:
        free = next((a for a in axes if not any((b, a) in before for b in axes if b != a)),
                    None)
        if free is None:
            raise NotShardableError(
                f"the {edges[0].params['of'].name} at {edges[0].loc} would take or make "
                f"one dimension split over the axes {sorted(axes)} in different orders, "
                f"which one loop over its regions cannot: shard its operands and results "
                f"on those axes in one order")
        ordered.append(free)
        axes.remove(free)
    return ordered


def _laid_out(nest: Nest, op: CoreOp, mesh: Mesh) -> Nest:
    """The edge's loops, less the tiling its values cannot arrive in or leave its regions
    with: a region's arguments and yields are laid out as SPMD types, where only the major
    axis tiling a dimension may pad it (`DTensorType.check`), and an axis split after the
    edge padded its factor (`CoreModule.refine_axis`) can leave a minor sub-axis padding
    it. Those values cross whole on the axes from that one on: the op reads the operand
    whole on them, the region makes the yield whole on them (alike on their devices)."""
    dropped: set[tuple[bool, int, str]] = set()  # (a result, its position, the axis)
    for made, values in ((False, op.operands), (True, op.results)):
        for k, v in enumerate(values):
            axes_of: dict[int, list[str]] = {}
            for lp in nest:
                a = lp.results[k] if made else lp.operands[k]
                d = (a.dim if isinstance(a, Tile) else None) if made else a
                if d is not None:
                    axes_of.setdefault(d, []).append(lp.axis)
            for d, axes in axes_of.items():
                first, rest = tile_size(v.type.shape[d], mesh[axes[0]]), 1
                for j, a in enumerate(axes[1:], 1):
                    rest *= mesh[a]
                    if first % rest:
                        dropped.update((made, k, b) for b in axes[j:])
                        break
    if not dropped:
        return nest
    return tuple(Loop(lp.axis,
                      tuple(ANY if (True, k, lp.axis) in dropped else a
                            for k, a in enumerate(lp.results)),
                      tuple(None if (False, i, lp.axis) in dropped else d
                            for i, d in enumerate(lp.operands)))
                 for lp in nest)


def _loop_on(nests: dict[int, Nest], op: CoreOp, axis: str) -> Loop | None:
    return next((lp for lp in nests.get(op.uid, ()) if lp.axis == axis), None)


def _sliced(nests: dict[int, Nest], op: CoreOp, i: int, axis: str) -> int | None:
    lp = _loop_on(nests, op, axis)
    return None if lp is None else lp.operands[i]


def _action(nests: dict[int, Nest], op: CoreOp, k: int, axis: str) -> AnyAction | Tile:
    lp = _loop_on(nests, op, axis)
    if lp is None:
        return ANY
    action = lp.results[k]
    if isinstance(action, Sum):
        raise NotImplementedError(f"a partial sum across an edge of "
                                  f"{op.params['of'].name} at {op.loc}")
    return action


def _producer_of(arg: Value, enters: list[CoreOp]) -> tuple[CoreOp, int]:
    for op in enters:
        for k, r in enumerate(op.results):
            if r is arg:
                return op, k
    raise ValueError(f"no edge makes region argument %{arg.name or arg.id}")


def _tiling(nests: dict[int, Nest], op: CoreOp, k: int, rank: int
            ) -> tuple[tuple[str, ...], ...]:
    """Per dimension, the axes tiling result k of op, outermost first."""
    dims: list[list[str]] = [[] for _ in range(rank)]
    for lp in nests.get(op.uid, ()):
        a = lp.results[k]
        if isinstance(a, Tile):
            dims[a.dim].append(lp.axis)
    return tuple(tuple(d) for d in dims)


def _slicing(nests: dict[int, Nest], op: CoreOp, i: int, rank: int
             ) -> tuple[tuple[str, ...], ...]:
    """Per dimension, the axes slicing operand i of op, outermost first."""
    dims: list[list[str]] = [[] for _ in range(rank)]
    for lp in nests.get(op.uid, ()):
        d = lp.operands[i]
        if d is not None:
            dims[d].append(lp.axis)
    return tuple(tuple(d) for d in dims)
