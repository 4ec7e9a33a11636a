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
from typing import TYPE_CHECKING, Any

from jax.extend import core as jcore
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from partir.ir import Location, Value
from partir.ir.opnames import SHARDING_CONSTRAINT
from partir.rules.elementwise import ANNOTATIONS

if TYPE_CHECKING:
    from partir.frontend.jaxpr_to_ir import BodyTag

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
    result, or a value inside the bodies of a control-flow op, as a `BodyTag`), its
    PartitionSpec (None for a sharding that has none), the axes of the mesh its sharding
    names, the JAX primitive it was (`source`) and where the model makes it."""

    value: Value | BodyTag
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


def own_annotations(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """A control-flow op's parameters with the annotations in its bodies (through the
    calls and control flow inside them) made `annotation_p`; the same object where
    there are none."""
    out = None
    for k, v in params.items():
        new = _own_param(v)
        if new is not v:
            out = out if out is not None else dict(params)
            out[k] = new
    return params if out is None else out


def _own_param(v: Any) -> Any:
    if isinstance(v, jcore.ClosedJaxpr):
        jaxpr = _own_jaxpr(v.jaxpr)
        return v if jaxpr is v.jaxpr else v.replace(jaxpr=jaxpr)
    if isinstance(v, jcore.Jaxpr):
        return _own_jaxpr(v)
    if isinstance(v, tuple):  # a cond's branches
        new = tuple(map(_own_param, v))
        return v if all(a is b for a, b in zip(new, v, strict=True)) else new
    return v


def _own_jaxpr(jaxpr: Any) -> Any:
    eqns = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ANNOTATIONS:
            eqn = eqn.replace(primitive=annotation_p,
                              params=annotation_params(name, eqn.params))
        else:
            params = own_annotations(eqn.params)
            if params is not eqn.params:
                eqn = eqn.replace(params=dict(params))
        eqns.append(eqn)
    if all(a is b for a, b in zip(eqns, jaxpr.eqns, strict=True)):
        return jaxpr
    return jaxpr.replace(eqns=eqns)


__all__ = ["Annotation", "annotation_p", "annotation_params", "own_annotations"]
