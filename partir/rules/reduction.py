"""Reductions, arg-reductions, cumulative ops, sort, top_k and approx_top_k.

A dimension the op does not reduce or scan along is a pass-through factor: each tile of
it is an independent instance of the op. A reduced dimension is a reduction factor only
where combining partial reductions is exactly the op's own monoid; arg-reductions,
scans, sorts and top_k along a sliced dimension would need cross-iteration fix-ups
(index offsets, carries, merges), so those dimensions need replication.
"""

from __future__ import annotations

import math
from dataclasses import replace

from partir.ir.monoids import of_reduce
from partir.rules.catalogue import Kind, OpView, Primitive, declare, per_point
from partir.rules.factors import RuleBuilder, ShardingRule


def _reduce(view: OpView, reduced, monoid: str | None) -> ShardingRule:
    """Kept dims pass through to their position among the kept dims, then the reduced
    dims in increasing order."""
    shape = view.in_types[0].shape
    b = RuleBuilder([len(shape)], [len(shape) - len(reduced)] * len(view.out_types))
    kept = [d for d in range(len(shape)) if d not in reduced]
    for out, d in enumerate(kept):
        b.factor(shape[d], {0: d}, dict.fromkeys(range(len(view.out_types)), out))
    for d in sorted(reduced):
        if monoid is None:
            b.replicated(shape[d], {0: d})
        else:
            b.factor(shape[d], {0: d}, kind="reduction", monoid=monoid)
    return b.build()


def reduce_rule(view: OpView) -> ShardingRule:
    monoid = of_reduce(view.name, view.in_types[0].dtype)
    return _reduce(view, view.params["axes"], monoid and monoid.name)


def argreduce_rule(view: OpView) -> ShardingRule:
    # A slice of the reduced dim would yield indices local to the tile, and picking the
    # winner needs the values too, which no monoid on the indices alone provides.
    return _reduce(view, view.params["axes"], None)


def _all_but(view: OpView, axis: int) -> ShardingRule:
    """Every dim but `axis` is a pass-through factor of all operands and results; `axis`
    is one need-replication factor per operand and result (top_k's results are shorter
    along it)."""
    shape = view.in_types[0].shape
    b = RuleBuilder([t.rank for t in view.in_types], [t.rank for t in view.out_types])
    for d in range(len(shape)):
        if d != axis:
            b.factor(shape[d], dict.fromkeys(range(len(view.in_types)), d),
                     dict.fromkeys(range(len(view.out_types)), d))
    sizes = {t.shape[axis] for t in (*view.in_types, *view.out_types)}
    if len(sizes) == 1:
        b.replicated(sizes.pop(), dict.fromkeys(range(len(view.in_types)), axis),
                     dict.fromkeys(range(len(view.out_types)), axis))
    else:
        for i, t in enumerate(view.in_types):
            b.replicated(t.shape[axis], operands={i: axis})
        for k, t in enumerate(view.out_types):
            b.replicated(t.shape[axis], results={k: axis})
    return b.build()


def cumulative_rule(view: OpView) -> ShardingRule:
    return _all_but(view, view.params["axis"])


def sort_rule(view: OpView) -> ShardingRule:
    return _all_but(view, view.params["dimension"])


def top_k_rule(view: OpView) -> ShardingRule:
    # The indices are positions along `axis`, which stays whole, so they need no offset.
    return _all_but(view, view.params["axis"])


def approx_top_k_rule(view: OpView) -> ShardingRule:
    # As top_k: the reduced dimension stays whole (a tile's candidates would need merging
    # and their indices an offset); `reduction_input_size_override` refers to it.
    return _all_but(view, view.params["reduction_dimension"] % view.in_types[0].rank)


def sort_flops(view: OpView, rule: ShardingRule | None) -> float:
    """|x| log2(n) comparisons along the sorted dimension of size n."""
    x = view.in_types[0]
    n = x.shape[view.params["dimension"]] if x.shape else 1
    return float(rule.elements_of_operand(0)) * max(1.0, math.log2(max(n, 1)))


def top_k_flops(view: OpView, rule: ShardingRule | None) -> float:
    """|x| log2(k) comparisons: a selection keeping k candidates per row."""
    return float(rule.elements_of_operand(0)) * max(1.0, math.log2(max(view.params["k"], 1)))


_REDUCE = Primitive(Kind.REDUCTION, per_point(1), reduce_rule,
                    doc="kept dims -> tile; a reduced dim -> #sum<monoid> (not prod/xor, "
                        "and/or on bool only)")
declare(("reduce_max", "reduce_min", "reduce_and", "reduce_or", "reduce_prod", "reduce_xor"),
        _REDUCE)
declare("reduce_sum", replace(_REDUCE, linear="all"))
declare(("argmax", "argmin"),
        Primitive(Kind.REDUCTION, per_point(1), argreduce_rule, doc="kept dims -> tile"))
declare(("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"),
        Primitive(Kind.KERNEL, per_point(1), cumulative_rule,
                  doc="t_d -> t_d for every d but the scanned axis"))
declare("sort", Primitive(Kind.KERNEL, sort_flops, sort_rule,
                          doc="t_d, ..., t_d -> t_d, ..., t_d for every d but the sorted "
                              "dimension"))
declare("top_k", Primitive(Kind.KERNEL, top_k_flops, top_k_rule,
                           doc="t_d -> t_d, t_d for every d but the top-k axis"))
declare("approx_top_k", Primitive(Kind.KERNEL, top_k_flops, approx_top_k_rule,
                                  doc="t_d -> t_d, t_d for every d but the reduced "
                                      "dimension"))
