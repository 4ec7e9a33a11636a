"""A control-flow op's data-flow edges as ops of the Core program (Shardy's
`ShardableDataFlowOpInterface`): the op's regions' ops are ops of the program like any
other, after the op's `partir.enter` ops, which make its regions' arguments from its
operands, and before its `partir.exit` ops, which make its results from its regions'
yields. One edge op per value that crosses: an operand entering one or more regions; a
carry, as one enter op (its operand and the yield fed back; its arguments and the op's
result after the last iteration: all sliced alike, so that the value carried has one
sharding); a result made anew each iteration, as an exit op. Its sharding rule is what
the op's declared `DataFlow` says of that value: the dimensions on both sides are the
same data, sliced alike, and a dimension each iteration takes or makes one slice of (a
scan's scanned dimension) needs replication. Propagation then runs through a body as
through any other code, and the control-flow op itself holds no sharding but its edges'.

A factor an axis does not divide pads at an edge as at any op: the regions' arguments
arrive padded and their yields leave padded, and the body's ops pad (and mask their
reductions) as ordinary ops do; only a dimension's first axis may pad it at an edge
(`Primitive.pads_tiles`).

Each edge op carries the control-flow op it belongs to as parameter `of`, and which of
its edges it is as `edge`: ("entry", operand), ("carry", carry) or ("exit", result).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from partir.ir import Op, Value
from partir.rules.catalogue import (
    DataFlow,
    Edge,
    Kind,
    OpView,
    Primitive,
    data_flow,
    declare,
    no_flops,
)
from partir.rules.factors import RuleBuilder, ShardingRule

ENTER = "partir.enter"
EXIT = "partir.exit"
EDGE_OPS = (ENTER, EXIT)


# Why the scanned dimension stays whole, with what a user can do instead: a loop over
# microbatches (gradient accumulation) is the common case, whose batch tiling reaches the
# scanned dimension through the reshape that makes the microbatches.
_SCANNED = ("it is the scanned dimension: every device runs every iteration, each on one "
            "slice of it; to run the loop sliced, tile another of its dimensions "
            "(FIRST_DIVISIBLE_DIM.after(0) for values stacked along it, such as a scan "
            "over layers' parameters; partir.tag the scanned value to name it in a "
            "tactic)")


@dataclass(frozen=True)
class EdgeOp:
    """One edge of a control-flow op, as an op: what it reads and makes."""

    name: str  # ENTER or EXIT
    edge: tuple[str, int]
    operands: tuple[Value, ...]
    results: tuple[Value, ...]


def written_name(op: Any) -> str:
    """The name of the op the user wrote: an edge op's control-flow op's, else its own
    (conflicts and padding records name an edge so)."""
    return op.params["of"].name if op.name in EDGE_OPS else op.name


def edge_ops(op: Op, flow: DataFlow) -> tuple[list[EdgeOp], list[EdgeOp]]:
    """The op's enter ops (in operand order; a carry's makes the op's result too) and exit
    ops (in result order)."""
    regions = op.regions
    enters: list[EdgeOp] = []
    carried = {c.operand: (n, c) for n, c in enumerate(flow.carries)}
    entries = by_value(flow.entries)
    for i, v in enumerate(op.operands):
        if i in carried:
            n, c = carried[i]
            r, p = c.made
            enters.append(EdgeOp(ENTER, ("carry", n), (v, regions[r].yields[p]),
                                 (*(regions[r2].args[p2] for r2, p2 in c.args),
                                  op.results[c.result])))
        elif i in entries:
            enters.append(EdgeOp(ENTER, ("entry", i), (v,),
                                 tuple(regions[e.region].args[e.position]
                                       for e in entries[i])))
    exits: list[EdgeOp] = []
    results = by_value(flow.exits)
    for k, v in enumerate(op.results):
        if k in results:
            exits.append(EdgeOp(EXIT, ("exit", k), tuple(
                regions[e.region].yields[e.position] for e in results[k]), (v,)))
    return enters, exits


def by_value(edges: tuple[Edge, ...]) -> dict[int, list[Edge]]:
    """The edges by the op's operand (or result) they join."""
    out: dict[int, list[Edge]] = {}
    for e in edges:
        out.setdefault(e.value, []).append(e)
    return out


def _leads(view: OpView) -> Iterator[int]:
    """Per operand and result of the edge op, how many leading dimensions of it the
    other side does not have (a scan's scanned operand or stacked result)."""
    op: Op = view.params["of"]
    kind, at = view.params["edge"]
    lead = data_flow(op).leads.get((kind, at), 0)
    if view.name == ENTER:
        # the op's operand (and a carry's yield) first, the regions' arguments after
        yield from (lead if i == 0 else 0 for i in range(len(view.in_types)))
        yield from (0 for _ in view.out_types)
    else:
        yield from (0 for _ in view.in_types)
        yield lead


def edge_rule(view: OpView) -> ShardingRule:
    """Every value of the edge holds the same data: per dimension of the whole value (the
    side with the leading dimensions), one factor over the dimensions holding it."""
    leads = list(_leads(view))
    n_in = len(view.in_types)
    types = [*view.in_types, *view.out_types]
    whole = max(range(len(types)), key=lambda x: leads[x])
    lead = leads[whole]
    b = RuleBuilder([t.rank for t in view.in_types], [t.rank for t in view.out_types])
    for d, size in enumerate(types[whole].shape):
        at = {x: d - lead + leads[x] for x in range(len(types))
              if d - lead + leads[x] >= 0}
        operands = {x: dd for x, dd in at.items() if x < n_in}
        results = {x - n_in: dd for x, dd in at.items() if x >= n_in}
        if d < lead:
            b.replicated(size, operands, results, why=_SCANNED)
        else:
            b.factor(size, operands, results)
    return b.build()


declare(ENTER, Primitive(Kind.FREE, no_flops, edge_rule, pads_tiles=False,
                         doc="a control-flow op's operand -> its regions' arguments"),
        jax=False)
declare(EXIT, Primitive(Kind.FREE, no_flops, edge_rule, pads_tiles=False,
                        doc="a control-flow op's regions' yields -> its result"),
        jax=False)
