"""The PartIR:HLO collectives and `axis_index`, as the catalogue declares them.

They exist only in device-local programs, so they have no sharding rule: what the
catalogue says of them is what the simulator reads (their kind). Their names are said
here, in the catalogue's layer, so that the declarations are made when the catalogue is
imported, whichever stage reads it; the PartIR:HLO dialect (`partir.hlo.ops`) builds,
prints and checks the ops under these names.
"""

from __future__ import annotations

from partir.rules.catalogue import Kind, Primitive, declare, no_flops

ALL_SLICE = "hlo.all_slice"
ALL_GATHER = "hlo.all_gather"
ALL_REDUCE = "hlo.all_reduce"
REDUCE_SCATTER = "hlo.reduce_scatter"
ALL_TO_ALL = "hlo.all_to_all"
AXIS_INDEX = "hlo.axis_index"

declare((ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL),
        Primitive(Kind.COLLECTIVE, no_flops), jax=False)
declare(ALL_SLICE, Primitive(Kind.MOVEMENT, no_flops), jax=False)
declare(AXIS_INDEX, Primitive(Kind.FREE, no_flops), jax=False)
