"""dot_general: batch dimensions and free (non-contracting) dimensions tile the result;
contracting dimensions sliced on both operands give a `#sum` loop."""

from __future__ import annotations

from partir.core.actions import Sum, Tile
from partir.core.tmr.registry import Entry, OpView, TileMapping, register


def dot_general_mappings(op: OpView):
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    lrank, rrank = op.in_types[0].rank, op.in_types[1].rank
    lfree = [d for d in range(lrank) if d not in lc and d not in lb]
    rfree = [d for d in range(rrank) if d not in rc and d not in rb]
    # Result layout: batch dims, then lhs free dims, then rhs free dims.
    for out, (l, r) in enumerate(zip(lb, rb, strict=True)):
        yield TileMapping((l, r), (Tile(out),))
    for j, l in enumerate(lfree):
        yield TileMapping((l, None), (Tile(len(lb) + j),))
    for j, r in enumerate(rfree):
        yield TileMapping((None, r), (Tile(len(lb) + len(lfree) + j),))
    for l, r in zip(lc, rc, strict=True):
        yield TileMapping((l, r), (Sum("add"),))


register("dot_general", Entry(dot_general_mappings, doc="matmul: batch/free -> tile, "
                                                        "contracting -> #sum"))
