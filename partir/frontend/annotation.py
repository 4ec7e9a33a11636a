"""The model's sharding annotations: JAX's `sharding_constraint` (what
`jax.lax.with_sharding_constraint` binds, and flax's logical constraints once their rules
resolve) and `reshard` are the identity for the computation.

The frontend makes each one `annotation_p` (`partir.sharding_constraint`), in the traced
program and inside control-flow bodies alike, and records it (`Annotation`). JAX's
primitive is never bound on device-local arrays: its sharding names a mesh the shard_map's
body is not on. `annotation_p` is partir's own identity, bindable anywhere as `partir.tag`
is; materialization removes the op where its uses read the value as it is. What the
annotation asks is for the `ShardingConstraints` tactic to apply; without it, the
annotations are reported as ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from partir.ir import Location, Value
from partir.ir.opnames import SHARDING_CONSTRAINT
from partir.rules.elementwise import ANNOTATIONS

annotation_p = Primitive(SHARDING_CONSTRAINT)
annotation_p.def_impl(lambda x, **_: x)
annotation_p.def_abstract_eval(lambda x, **_: x)
mlir.register_lowering(annotation_p, lambda ctx, x, **_: [x])
# The Core interpreter runs a sliced loop's bodies under a vmap per axis.
batching.primitive_batchers[annotation_p] = lambda args, dims, **params: (
    annotation_p.bind(args[0], **params), dims[0])


@dataclass(frozen=True)
class Annotation:
    """A sharding annotation of the traced program: the value it annotates (the op's
    result, inside a control-flow op's regions or not), its
    PartitionSpec (None for a sharding that has none), the axes of the mesh its sharding
    names, the JAX primitive it was (`source`) and where the model makes it."""

    value: Value
    loc: Location
    spec: PartitionSpec | None
    mesh_axes: tuple[str, ...]
    source: str

    @property
    def label(self) -> str:
        return f"the sharding annotation at {self.loc} ({self.spec})"


def annotation_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of the `partir.sharding_constraint` op a JAX annotation becomes:
    what its sharding says (a NamedSharding's spec and mesh axes; other shardings name
    no axes)."""
    sharding = params[ANNOTATIONS[name]]
    mesh = getattr(sharding, "mesh", None)
    return {"spec": getattr(sharding, "spec", None),
            "mesh_axes": tuple(getattr(mesh, "axis_names", ())), "source": name}


# Parameters in which JAX records the sharding of an op's result type.
_TYPED_SHARDINGS = ("sharding", "out_sharding")


def untyped(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """The parameters without the shardings on a mesh of Auto axes that an annotation
    leaves in the types after it: JAX types an annotation's result on the annotation's
    mesh, and the ops computed from it record that in their `sharding`/`out_sharding`.
    On Auto axes these say nothing about the computation, and the device-local program
    runs on another mesh (its shard_map's) where they cannot be bound; the same object
    where there are none."""
    out = None
    for k in _TYPED_SHARDINGS:
        v = params.get(k)
        if isinstance(v, NamedSharding) and all(
                t == AxisType.Auto for t in v.mesh.axis_types):
            out = out if out is not None else dict(params)
            out[k] = None
    return params if out is None else out


__all__ = ["Annotation", "annotation_p", "annotation_params"]
