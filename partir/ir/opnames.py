"""Names of partir's own ops that sit among JAX primitives in the IR, said once.

An op's name is what every stage dispatches on, so partir's own ops are named in their own
namespace (`partir.`), never with a word JAX may use for a primitive: JAX 0.10's `tile`
primitive (`jnp.tile`) was once taken for the value-tiling identity below and dropped.
The dialects' ops carry their own prefixes (`core.loop`, `spmd.execute`, `hlo.all_gather`).
Printers show the paper's bare words (`tag "h" %x`); only the names are namespaced.
"""

from __future__ import annotations

NAMESPACE = "partir."

# `partir.tag(x, name)`: the frontend's identity primitive naming a model-internal value.
TAG = NAMESPACE + "tag"
# The Core value actions' identities: value tiling (`tile<%x, d, "a">`) and keeping a value
# replicated (`atomic<%x, "a">`, or `barrier<%x, "a">`, its readers free to slice it);
# materialization turns them into loops or removes them.
TILE = NAMESPACE + "tile"
ATOMIC = NAMESPACE + "atomic"
# A literal or closed-over array, which the frontend makes an op.
CONSTANT = NAMESPACE + "constant"
# A sharding annotation in the model (JAX's `sharding_constraint`, `reshard`), which the
# frontend makes this identity: the computation never runs JAX's annotation, whose
# sharding names a mesh the device-local program is not on; the ShardingConstraints
# tactic reads it.
SHARDING_CONSTRAINT = NAMESPACE + "sharding_constraint"

# Every name above: `rules.catalogue.declare(..., jax=False)` takes only namespaced names.
OWN_OPS = (TAG, TILE, ATOMIC, CONSTANT, SHARDING_CONSTRAINT)
