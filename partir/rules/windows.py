"""Window reductions (pooling) and their gradients: `reduce_window_sum/max/min`, the
generic `reduce_window`, `select_and_scatter_add` (max-pool's gradient) and
`select_and_gather_add` (its forward-mode derivative).

A dimension whose window is 1 with stride 1, no padding and no dilation (the batch and
channel dims of a pooling) maps each operand element to the result element at the same
position: a pass-through factor of every array operand and result. Any other dimension
needs replication: a tile of the result would need a halo of its neighbours' elements
(and the window offsets of strided, padded or dilated dims), which partir does not
exchange. The generic reduce_window's init values are scalars, read whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from partir.rules.catalogue import Kind, OpView, Primitive, declare
from partir.rules.factors import RuleBuilder, ShardingRule


def _unit(params, d: int) -> bool:
    """Is dimension d's window the identity (size 1, stride 1, no padding/dilation)?"""
    ones = ("window_dimensions", "window_strides", "base_dilation", "window_dilation")
    return (all(params[p][d] == 1 for p in ones if p in params)
            and tuple(params["padding"][d]) == (0, 0))


def _window_rule(view: OpView, arrays: Sequence[int]) -> ShardingRule:
    """Operands `arrays` and every result are windowed arrays of one rank; other
    operands (init values) are scalars."""
    ins = [view.in_types[i] for i in arrays]
    b = RuleBuilder([t.rank for t in view.in_types], [t.rank for t in view.out_types])
    for d in range(ins[0].rank):
        if _unit(view.params, d):
            b.factor(ins[0].shape[d], dict.fromkeys(arrays, d),
                     dict.fromkeys(range(len(view.out_types)), d))
            continue
        sizes = {t.shape[d] for t in (*ins, *view.out_types)}
        if len(sizes) == 1:
            b.replicated(sizes.pop(), dict.fromkeys(arrays, d),
                         dict.fromkeys(range(len(view.out_types)), d))
        else:
            for i in arrays:
                b.replicated(view.in_types[i].shape[d], operands={i: d})
            for k, t in enumerate(view.out_types):
                b.replicated(t.shape[d], results={k: d})
    return b.build()


def reduce_window_rule(view: OpView) -> ShardingRule:
    # reduce_window_{sum,max,min}: one operand; reduce_window: the arrays, then as many
    # scalar init values.
    return _window_rule(view, range(len(view.out_types)))


def select_and_scatter_add_rule(view: OpView) -> ShardingRule:
    # (source: the pooled shape, operand: the pooling's input) -> the operand's shape.
    return _window_rule(view, (0, 1))


def select_and_gather_add_rule(view: OpView) -> ShardingRule:
    # (tangents, operand), both the pooling's input -> the pooled shape.
    return _window_rule(view, (0, 1))


def _window(view: OpView) -> int:
    return math.prod(view.params["window_dimensions"])


def window_flops(view: OpView, rule: ShardingRule | None) -> float:
    """One op per window element per output element (of every result), as XLA's
    HloCostAnalysis counts a reduce-window."""
    return float(_window(view) * sum(t.size for t in view.out_types))


def select_and_scatter_flops(view: OpView, rule: ShardingRule | None) -> float:
    """Per source element, one select per window element, then one add scattering it, as
    XLA's HloCostAnalysis counts a select-and-scatter."""
    return float(view.in_types[0].size * (_window(view) + 1))


def select_and_gather_flops(view: OpView, rule: ShardingRule | None) -> float:
    """Per output element, one select per window element (XLA lowers it to a
    reduce-window over (value, tangent) pairs)."""
    return float(view.out_types[0].size * _window(view))


_DOC = "t_d -> t_d for every dim whose window is 1 (stride 1, no padding or dilation)"
declare(("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window"),
        Primitive(Kind.KERNEL, window_flops, reduce_window_rule, doc=_DOC))
declare("select_and_scatter_add", Primitive(
    Kind.KERNEL, select_and_scatter_flops, select_and_scatter_add_rule,
    doc="t_d, t_d -> t_d for every dim whose window is 1 (stride 1, no padding)"))
declare("select_and_gather_add", Primitive(
    Kind.KERNEL, select_and_gather_flops, select_and_gather_add_rule,
    doc="t_d, t_d -> t_d " + _DOC[len("t_d -> t_d "):]))
