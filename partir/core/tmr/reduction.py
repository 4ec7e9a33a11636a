"""Reductions, arg-reductions, cumulative ops, sort and top_k.

A dimension the op does not reduce or scan along tiles the matching result dimension:
each tile of it is an independent instance of the op. A reduced dimension sliced across
iterations gives a `#sum` loop only where combining the partial reductions is exactly
the op's own monoid. Arg-reductions, scans, sorts and top_k along a sliced dimension
would need cross-iteration fix-ups (index offsets, carries, merges), so they are not
offered.
"""

from __future__ import annotations

import numpy as np

from partir.core.actions import Sum, Tile
from partir.core.tmr.registry import Entry, OpView, TileMapping, register

# reduce_prod and reduce_xor have no monoid among the `#sum` actions.
_MONOID = {"reduce_sum": "add", "reduce_max": "max", "reduce_min": "min",
           "reduce_and": "and", "reduce_or": "or"}
# On integers reduce_and/reduce_or are bitwise, whereas `#sum<and>`/`#sum<or>` are
# logical: only bool operands can be combined with them.
_BOOL_ONLY = ("reduce_and", "reduce_or")


def _tile_kept_dims(op: OpView, reduced):
    """Every operand dim not in `reduced` tiles its position among the kept dims."""
    kept = [d for d in range(op.in_types[0].rank) if d not in reduced]
    for out, d in enumerate(kept):
        yield TileMapping((d,), (Tile(out),))


def reduce_mappings(op: OpView):
    axes = op.params["axes"]
    yield from _tile_kept_dims(op, axes)
    monoid = _MONOID.get(op.name)
    if monoid is None:
        return
    if op.name in _BOOL_ONLY and np.dtype(op.in_types[0].dtype) != np.bool_:
        return
    for d in sorted(axes):
        yield TileMapping((d,), (Sum(monoid),))


def argreduce_mappings(op: OpView):
    # A slice of the reduced dim would yield indices local to the tile, and picking the
    # winner needs the values too, which no monoid on the indices alone provides.
    yield from _tile_kept_dims(op, op.params["axes"])


def _all_but(op: OpView, axis: int):
    """Every dim except `axis` tiles the same dim of all operands and results."""
    for d in range(op.in_types[0].rank):
        if d != axis:
            yield TileMapping(tuple(d for _ in op.in_types), tuple(Tile(d) for _ in op.out_types))


def cumulative_mappings(op: OpView):
    yield from _all_but(op, op.params["axis"])


def sort_mappings(op: OpView):
    yield from _all_but(op, op.params["dimension"])


def top_k_mappings(op: OpView):
    # The indices are positions along `axis`, which stays whole, so they need no offset.
    yield from _all_but(op, op.params["axis"])


register(("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or", "reduce_prod",
          "reduce_xor"),
         Entry(reduce_mappings, doc="kept dims -> tile; a reduced dim -> #sum<monoid> "
                                    "(not prod/xor, and/or on bool only)"))
register(("argmax", "argmin"), Entry(argreduce_mappings, doc="kept dims -> tile"))
register(("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"),
         Entry(cumulative_mappings, doc="t_d -> t_d for every d but the scanned axis"))
register("sort", Entry(sort_mappings, doc="t_d, ..., t_d -> t_d, ..., t_d for every d but "
                                          "the sorted dimension"))
register("top_k", Entry(top_k_mappings, doc="t_d -> t_d, t_d for every d but the top-k axis"))
