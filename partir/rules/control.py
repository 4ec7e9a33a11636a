"""Control flow: `scan`, `while` and `cond`, declared by their data-flow edges.

An op with regions is declared by how its operands and results meet its regions'
arguments and yields (`DataFlow`, Shardy's `ShardableDataFlowOpInterface`): the passes
see its edges as ops of the program (`partir.rules.edges`) and its regions' ops as
ordinary ops, so it needs no sharding rule of its own. What it runs is `lax.scan`,
`lax.while_loop` or `lax.switch` over its regions (`REGION_EVALUATORS`), and its operand
and result types are those its regions' types give.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from jax import lax

from partir.ir import Op, Region
from partir.ir.dtypes import canonical
from partir.ir.evaluate import REGION_EVALUATORS, run_region
from partir.ir.types import TensorType
from partir.ir.verifier import register_type_rule
from partir.rules.catalogue import (
    Carry,
    DataFlow,
    Edge,
    Kind,
    OpView,
    Primitive,
    declare,
    region_flops,
)


def scan_flow(view: OpView) -> DataFlow:
    """The consts and the scanned operands' slices (one leading dimension fewer) enter
    the body each iteration, the carries loop through it, and each iteration's body
    results make one slice of the stacked results."""
    nc, nk = view.params["num_consts"], view.params["num_carry"]
    return DataFlow(
        entries=(*(Edge(i, 0, i) for i in range(nc)),
                 *(Edge(i, 0, i, lead=1) for i in range(nc + nk, len(view.in_types)))),
        exits=tuple(Edge(k, 0, k, lead=1) for k in range(nk, len(view.out_types))),
        carries=tuple(Carry(nc + k, ((0, nc + k),), (0, k), k) for k in range(nk)),
        trips=(view.params["length"],))


def while_flow(view: OpView) -> DataFlow:
    """The predicate's consts enter region 0 (the predicate), the body's region 1; the
    carries are arguments of both, and the body makes their next values."""
    cn, bn = view.params["cond_nconsts"], view.params["body_nconsts"]
    nk = len(view.in_types) - cn - bn
    return DataFlow(
        entries=(*(Edge(i, 0, i) for i in range(cn)),
                 *(Edge(cn + i, 1, i) for i in range(bn))),
        exits=(),
        carries=tuple(Carry(cn + bn + k, ((0, cn + k), (1, bn + k)), (1, k), k)
                      for k in range(nk)),
        predicate=(0, 0), trips=(None, None))


def run_scan(op: Op, operands: Sequence[Any]) -> list[Any]:
    p = op.params
    nc, nk = p["num_consts"], p["num_carry"]
    consts, init, xs = operands[:nc], operands[nc:nc + nk], operands[nc + nk:]
    (body,) = op.regions

    def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        outs = run_region(body, [*consts, *carry, *x])
        return outs[:nk], outs[nk:]

    carry, ys = lax.scan(step, list(init), list(xs), length=p["length"],
                         reverse=p["reverse"], unroll=p["unroll"])
    return [*carry, *ys]


def run_while(op: Op, operands: Sequence[Any]) -> list[Any]:
    cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
    cond_consts, body_consts = operands[:cn], operands[cn:cn + bn]
    cond, body = op.regions
    return list(lax.while_loop(lambda c: run_region(cond, [*cond_consts, *c])[0],
                               lambda c: run_region(body, [*body_consts, *c]),
                               list(operands[cn + bn:])))


def run_cond(op: Op, operands: Sequence[Any]) -> list[Any]:
    index, *args = operands
    branches = [functools.partial(_run_branch, region) for region in op.regions]
    return list(lax.switch(index, branches, *args))


def _run_branch(region: Region, *args: Any) -> list[Any]:
    return run_region(region, args)


def cond_flow(view: OpView) -> DataFlow:
    """The operands after the branch index enter every branch; every branch makes the
    results."""
    branches = range(len(view.regions))
    return DataFlow(
        entries=tuple(Edge(i, b, i - 1) for b in branches for i in range(1, len(view.in_types))),
        exits=tuple(Edge(k, b, k) for b in branches for k in range(len(view.out_types))),
        trips=(1,) * len(branches), alternatives=True)


def _global_view(view: OpView) -> OpView:
    """The op on global types, which its regions' types give (a local view has the
    global parameters and regions)."""
    p, regions = view.params, view.regions
    args = [[v.type for v in r.args] for r in regions]
    yields = [[v.type for v in r.yields] for r in regions]
    if view.name == "scan":
        n, nc, nk = p["length"], p["num_consts"], p["num_carry"]
        ins = [t if i < nc + nk else TensorType((n, *t.shape), t.dtype)
               for i, t in enumerate(args[0])]
        outs = [t if k < nk else TensorType((n, *t.shape), t.dtype)
                for k, t in enumerate(yields[0])]
    elif view.name == "while":
        ins = [*args[0][:p["cond_nconsts"]], *args[1]]
        outs = yields[1]
    else:
        ins = [view.in_types[0], *args[0]]
        outs = yields[0]
    return OpView(view.name, p, tuple(ins), tuple(outs), regions=regions)


def _type_error(op: Op) -> str | None:
    """The op's operand and result types must be those its regions' types give (a scan's
    scanned operands and stacked results with its length in front)."""
    if not all(isinstance(v.type, TensorType) for v in (*op.operands, *op.results)):
        return None  # on distributed types: its dialect's rules check it
    given = OpView.of(op)
    want = _global_view(given)
    for what, got, expected in (("operand", given.in_types, want.in_types),
                                ("result", given.out_types, want.out_types)):
        if len(got) != len(expected):
            return f"{len(got)} {what}s, its regions give {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            if g.shape != e.shape or canonical(g.dtype) != canonical(e.dtype):
                return f"{what} {i} is {g}, its regions give {e}"
    return None


# The control-flow primitives: their data-flow edges and how they run.
_FLOWS = {"scan": (scan_flow, run_scan), "while": (while_flow, run_while),
          "cond": (cond_flow, run_cond)}
CONTROL_FLOW = tuple(_FLOWS)

_CONTROL = Primitive(Kind.KERNEL, region_flops,
                     doc="its regions' ops and data-flow edges hold its shardings")
for _name, (_flow, _run) in _FLOWS.items():
    declare(_name, replace(_CONTROL, data_flow=_flow))
    REGION_EVALUATORS.register(_name, _run)
    register_type_rule(_name)(_type_error)
