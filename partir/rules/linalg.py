"""dot_general (convolutions are in `partir.rules.conv`)."""

from __future__ import annotations

from partir.rules.catalogue import Kind, OpView, Primitive, declare, per_point
from partir.rules.factors import RuleBuilder, ShardingRule


def dot_general_rule(view: OpView) -> ShardingRule:
    """Batch dims and free (non-contracting) dims pass through to the result (laid out as
    batch dims, then lhs free dims, then rhs free dims); contracting dims are a reduction
    (`#sum`)."""
    (lc, rc), (lb, rb) = view.params["dimension_numbers"]
    lhs, rhs = view.in_types
    b = RuleBuilder([lhs.rank, rhs.rank], [view.out_types[0].rank])
    lfree = [d for d in range(lhs.rank) if d not in lc and d not in lb]
    rfree = [d for d in range(rhs.rank) if d not in rc and d not in rb]
    for out, (l, r) in enumerate(zip(lb, rb, strict=True)):
        b.factor(lhs.shape[l], {0: l, 1: r}, {0: out})
    for j, l in enumerate(lfree):
        b.factor(lhs.shape[l], {0: l}, {0: len(lb) + j})
    for j, r in enumerate(rfree):
        b.factor(rhs.shape[r], {1: r}, {0: len(lb) + len(lfree) + j})
    for l, r in zip(lc, rc, strict=True):
        b.factor(lhs.shape[l], {0: l, 1: r}, kind="reduction", monoid="add")
    return b.build()


# 2 FLOPs (a multiply and an add) per point: per output element and contracted element.
declare("dot_general", Primitive(Kind.KERNEL, per_point(2), dot_general_rule, matmul=True,
                                 linear="one",
                                 doc="matmul: batch/free -> tile, contracting -> #sum"))

