"""The PartIR:HLO collectives and `axis_index`, as the catalogue declares them.

They exist only in device-local programs, so they have no sharding rule: what the
catalogue says of them is what the simulator reads (their kind). Their names are said
here, in the catalogue's layer, so that the declarations are made when the catalogue is
imported, whichever stage reads it; the PartIR:HLO dialect (`partir.hlo.ops`) builds,
prints and checks the ops under these names.
"""

from __future__ import annotations

from typing import Any

from partir.rules.catalogue import Kind, Primitive, declare, no_flops

ALL_SLICE = "hlo.all_slice"
ALL_GATHER = "hlo.all_gather"
ALL_REDUCE = "hlo.all_reduce"
REDUCE_SCATTER = "hlo.reduce_scatter"
ALL_TO_ALL = "hlo.all_to_all"
COLLECTIVE_PERMUTE = "hlo.collective_permute"
AXIS_INDEX = "hlo.axis_index"

# The ops that name mesh axes: the collectives and `axis_index`.
NAMED_AXIS_OPS = (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL, COLLECTIVE_PERMUTE,
                  ALL_SLICE, AXIS_INDEX)


def named_axes(op: Any) -> tuple[str, ...]:
    """The mesh axes a collective (or `axis_index`) names, major to minor."""
    if op.name == AXIS_INDEX:
        return (op.params["axis"],)
    return tuple(a for x in op.params.get("axes", ()) for a in ((x,) if isinstance(x, str)
                                                                 else x))


declare((ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL, COLLECTIVE_PERMUTE),
        Primitive(Kind.COLLECTIVE, no_flops), jax=False)
declare(ALL_SLICE, Primitive(Kind.MOVEMENT, no_flops), jax=False)
declare(AXIS_INDEX, Primitive(Kind.FREE, no_flops), jax=False)
