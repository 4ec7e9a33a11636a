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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from partir.ir import Location, Op, Value
from partir.rules.catalogue import data_flow
from partir.rules.edges import edge_ops


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
