"""Tiles of the scatters other than scatter-add (see `partir.rules.indexing`).

scatter-sub is scatter-add's tile: its `#sum` loops keep the operand in one iteration
(operand - p0 + (0 - p1) + ... = operand - sum of the updates). scatter-min/max tiles
keep the operand in every iteration (min and max are idempotent); scatter (set) and
scatter-mul have no `#sum` loop. All of them, on a sliced indexed operand dim, take the
updates whose index falls in their chunk, shifted to its start.
"""

from __future__ import annotations

from partir.core.tmr.indexing import scatter_add_apply, scatter_local
from partir.core.tmr.registry import register_apply
from partir.rules import OpView


def scatter_apply(op: OpView, prim, operands, ctx):
    operand, indices, updates = operands
    indices, params = scatter_local(op, indices, ctx)
    return [prim.bind(operand, indices, updates, **params)]


register_apply("scatter-sub", scatter_add_apply)
for _name in ("scatter", "scatter-mul", "scatter-min", "scatter-max"):
    register_apply(_name, scatter_apply)
