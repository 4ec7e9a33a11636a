"""JAX function -> IR: trace with `jax.make_jaxpr`, inline calls, keep constants, name
arguments and results, and attach the user's source line to every op."""

from __future__ import annotations

import functools
import itertools
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from partir.errors import TracingError
from partir.frontend.annotation import (
    Annotation,
    annotation_p,
    annotation_params,
    untyped,
)
from partir.frontend.names import leaf_names, output_root, parameter_names
from partir.frontend.source import is_user_file, model_location, user_location
from partir.ir import UNKNOWN_LOCATION, Function, Location, Op, Region, TensorType, Value
from partir.ir.dtypes import is_extended
from partir.ir.opnames import CONSTANT, TAG
from partir.ir.types import tensor_type
from partir.rules.catalogue import CATALOGUE
from partir.rules.control import CONTROL_FLOW
from partir.rules.elementwise import ANNOTATIONS

# Call-like primitives whose body is inlined, and the parameter that holds the body.
INLINED_CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}
# The parameters in which a control-flow primitive holds its bodies (closed jaxprs), in
# the order of its regions: they become the op's regions.
_BODIES = ("jaxpr", "cond_jaxpr", "body_jaxpr", "branches")
# What the op keeps of them instead: a number, equal for ops with the very same bodies
# (a layer's scan traced once and called again), so that their signatures agree and
# propagation shares its decisions between them; never the same for other bodies, in
# this trace or another (signatures key memos that outlive a trace).
BODIES_KEY = "_bodies"
_body_numbers = itertools.count()


def _bodies(params: Any) -> list[Any]:
    found = [params[k] for k in _BODIES[:3] if k in params]
    return found + list(params.get("branches", ()))


@dataclass
class TracedProgram:
    """A traced function: its IR, how its flat inputs/outputs map to pytrees, and names."""

    function: Function
    in_tree: Any
    out_tree: Any
    input_names: list[str]
    output_names: list[str]
    static_argnums: tuple[int, ...] = ()
    # Each tag's values, in program order, those inside control-flow ops' regions too.
    tags: dict[str, list[Value]] = field(default_factory=dict)
    # The model's sharding annotations, in program order (`partir.frontend.annotation`).
    annotations: list[Annotation] = field(default_factory=list)

    @property
    def in_types(self) -> list[TensorType]:
        return [a.type for a in self.function.args]


def _tensor_type(aval: Any) -> TensorType:
    return _shaped_type(aval.shape, aval.dtype)


# A model's equations have few distinct shapes: each type is built once and shared (types
# are immutable), instead of converting the shape and dtype for each of the equations.
@functools.lru_cache(maxsize=4096)
def _shaped_type(shape: tuple, dtype: Any) -> TensorType:
    return tensor_type(tuple(map(int, shape)), _element_type(dtype))


@functools.lru_cache(maxsize=256)
def _element_type(dtype: Any) -> Any:
    # Extended dtypes (PRNG keys) stay JAX's: their primitives are re-bound on key arrays.
    return dtype if is_extended(dtype) else np.dtype(dtype)


# Where an equation of a jaxpr the compiler traced comes from, given its source info; None:
# the location of the call (`inline_jaxpr`).
Locate = Callable[[Any], Location | None]


class _Builder:
    def __init__(self, outer: _Builder | None = None, locate: Locate | None = None) -> None:
        self.ops: list[Op] = []
        self.locate = locate if outer is None else outer.locate
        self.producer: dict[Value, Op] = {}  # for the declarations' `canonical` forms
        self.scalar_consts: dict[tuple, Value] = {}
        self.tags: dict[str, list[Value]] = {} if outer is None else outer.tags
        self.annotations: list[Annotation] = [] if outer is None else outer.annotations
        # The bodies seen, by their objects' ids -> (their key, the objects, kept alive so
        # that their ids stay theirs): shared by the builders of one trace.
        self.body_keys: dict[tuple[int, ...], tuple[int, tuple]] = (
            {} if outer is None else outer.body_keys)

    def emit(self, op: Op) -> None:
        self.ops.append(op)
        for r in op.results:
            self.producer[r] = op

    def region(self, body: Any, loc: Location, user_frames: bool) -> Region:
        """A control-flow op's body (a closed jaxpr) as a region of IR ops, calls
        inlined, its constants `constant` ops in it."""
        inner = _Builder(self)
        args = [Value(_tensor_type(v.aval)) for v in body.jaxpr.invars]
        yields = inner.inline(body.jaxpr, body.consts, args, loc, user_frames)
        return Region(args, inner.ops, yields)

    def constant(self, value: Any, loc: Location, aval: Any) -> Value:
        # Python scalars in literals are 64-bit; the traced type says what JAX computes in.
        arr = np.asarray(value, dtype=aval.dtype)
        key = None
        if arr.ndim == 0:
            key = (arr.dtype.str, arr.tobytes())
            if key in self.scalar_consts:
                return self.scalar_consts[key]
        v = Value(tensor_type(arr.shape, arr.dtype))
        self.emit(Op(CONSTANT, [], [v], {"value": arr}, loc=loc))
        if key is not None:
            self.scalar_consts[key] = v
        return v

    def inline(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Value],
               call_loc: Location = UNKNOWN_LOCATION, user_frames: bool = True) -> list[Value]:
        """Append the ops of `jaxpr` applied to `args`. Equations of a called body whose
        trace has no user frame (bodies JAX cached from an earlier trace) get the
        location of the call; without `user_frames`, every equation gets it."""
        env: dict[Any, Value] = {}
        for var, c in zip(jaxpr.constvars, consts, strict=True):
            env[var] = self.constant(c, Location("<constant>", 0) if user_frames else call_loc,
                                     var.aval)
        for var, a in zip(jaxpr.invars, args, strict=True):
            env[var] = a

        def read(atom: Any, loc: Location) -> Value:
            if isinstance(atom, jcore.Literal):
                return self.constant(atom.val, loc, atom.aval)
            return env[atom]

        for eqn in jaxpr.eqns:
            if user_frames:
                loc = user_location(eqn.source_info)
            else:
                loc = (self.locate and self.locate(eqn.source_info)) or call_loc
            if loc is UNKNOWN_LOCATION:
                loc = call_loc
            operands = [read(a, loc) for a in eqn.invars]
            name = eqn.primitive.name
            if name in INLINED_CALLS and INLINED_CALLS[name] in eqn.params:
                body = eqn.params[INLINED_CALLS[name]]
                if hasattr(body, "jaxpr"):  # a ClosedJaxpr
                    outs = self.inline(body.jaxpr, body.consts, operands, loc, user_frames)
                else:
                    outs = self.inline(body, (), operands, loc, user_frames)
            else:
                outs = [Value(_tensor_type(v.aval)) for v in eqn.outvars]
                # JAX's own dict, shared (IR is never mutated), but where a parameter is
                # added.
                params, prim = eqn.params, eqn.primitive
                if name in ANNOTATIONS:
                    params = annotation_params(name, params)
                    name, prim = annotation_p.name, annotation_p
                    if loc is not UNKNOWN_LOCATION:  # else JAX's own: a gradient's seed
                        loc = model_location(eqn.source_info) if user_frames else loc
                        self.annotations.append(Annotation(outs[0], loc, **params))
                else:
                    params = untyped(params)
                regions = []
                if name in CONTROL_FLOW:
                    bodies = tuple(_bodies(params))
                    regions = [self.region(b, loc, user_frames) for b in bodies]
                    ids = tuple(map(id, bodies))
                    if ids not in self.body_keys:
                        self.body_keys[ids] = (next(_body_numbers), bodies)
                    key = self.body_keys[ids][0]
                    params = {**{k: v for k, v in params.items() if k not in _BODIES},
                              BODIES_KEY: key}
                if name == TAG:
                    outs[0].name = params["name"]
                    self.tags.setdefault(params["name"], []).append(outs[0])
                op = Op(name, operands, outs, params, regions, loc=loc, prim=prim)
                declared = CATALOGUE.get(name)
                canonical = declared.canonical if declared is not None else None
                for made in (canonical and canonical(op, self.producer.get)) or [op]:
                    self.emit(made)
            for var, v in zip(eqn.outvars, outs, strict=True):
                if not isinstance(var, jcore.DropVar):
                    env[var] = v
        return [read(a, Location("<return>", 0)) for a in jaxpr.outvars]


def inline_jaxpr(closed: Any, args: Sequence[Value], loc: Location = UNKNOWN_LOCATION,
                 locate: Locate | None = None) -> tuple[list[Op], list[Value]]:
    """The ops of a closed jaxpr applied to `args`, and its results: how a later stage
    turns a JAX computation into IR ops (e.g. an op's local computation inside a loop).
    Calls are inlined and literals become `constant` ops, as in `trace`; every op gets
    `loc` (the jaxpr was traced by the compiler, not from the user's code), or where
    `locate` finds one in its equation's source info, that one (the user's op a
    transformed program computes it for)."""
    builder = _Builder(locate=locate)
    results = builder.inline(closed.jaxpr, closed.consts, args, loc, user_frames=False)
    return builder.ops, results


def _unsharded(x: Any) -> jax.ShapeDtypeStruct:
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _user_frame_of(exc: BaseException) -> Location | None:
    """The innermost frame of the exception's traceback in the user's code."""
    found = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if is_user_file(frame.f_code.co_filename):
            found = Location(frame.f_code.co_filename, line, frame.f_code.co_name)
    return found


def trace(fn: Callable, *args: Any, static_argnums: Sequence[int] = (),
          name: str | None = None) -> TracedProgram:
    """Trace `fn(*args)` into IR. Arguments may be arrays or `jax.ShapeDtypeStruct`s."""
    static_argnums = tuple(sorted(i % len(args) for i in static_argnums)) if args else ()
    # Traced on avals without the arguments' shardings: arrays placed on a mesh would
    # otherwise put that mesh into the ops' params (`out_sharding`, `sharding`), which the
    # device-local replay cannot bind inside its shard_map, and explicit mesh axes would
    # type-check the single-device program as if it were sharded.
    try:
        abstract = tuple(a if i in static_argnums else jax.tree.map(_unsharded, a)
                         for i, a in enumerate(args))
        closed, out_shape = jax.make_jaxpr(fn, static_argnums=static_argnums,
                                           return_shape=True)(*abstract)
    except Exception as e:
        raise TracingError(f"could not trace {getattr(fn, '__name__', fn)!r}: "
                           f"{type(e).__name__}: {e}", loc=_user_frame_of(e)) from e

    dyn_args = [a for i, a in enumerate(args) if i not in static_argnums]
    all_names = parameter_names(fn, len(args))
    dyn_names = [n for i, n in enumerate(all_names) if i not in static_argnums]
    input_names: list[str] = []
    for arg_name, arg in zip(dyn_names, dyn_args, strict=True):
        input_names += leaf_names(arg, arg_name)
    _, in_tree = jax.tree_util.tree_flatten(tuple(dyn_args))

    jaxpr = closed.jaxpr
    if len(jaxpr.invars) != len(input_names):
        raise TracingError(f"traced {len(jaxpr.invars)} inputs but named {len(input_names)}")
    arg_values = [Value(_tensor_type(v.aval), name=n)
                  for v, n in zip(jaxpr.invars, input_names, strict=True)]
    builder = _Builder()
    results = builder.inline(jaxpr, closed.consts, arg_values)

    out_tree = jax.tree_util.tree_structure(out_shape)
    output_names = leaf_names(out_shape, output_root(
        [*input_names, *builder.tags]))
    fn_name = name or getattr(fn, "__name__", "main")
    function = Function(fn_name if fn_name.isidentifier() else "main", arg_values,
                        builder.ops, results, output_names)
    return TracedProgram(function, in_tree, out_tree, input_names, output_names,
                         static_argnums, builder.tags,
                         annotations=builder.annotations)
