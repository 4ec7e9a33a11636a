"""Sequential interpreter of PartIR:Core: the first correctness oracle.

Each `loop` runs its body once per index of its range, one iteration at a time; `#tile`
concatenates the iterations' results, `#sum` reduces them with the monoid, `any` checks
they are all equal. `slice` takes the index-th chunk and `index` is the iteration number.
Primitives replay through JAX.

A loop whose body holds a control-flow op with a collective over the loop's axis in its
regions (a sync point: partial sums summed inside a scan's body) runs its iterations in
lockstep instead: the body is vmapped over the indices with the axis as the vmap's axis
name, so each iteration's collective sees the others.

The interpreters run a program as one computation (`checked`, `jax.jit`): each op run
eagerly would be a compilation of its own. What they check of the values computed (an
`any` loop's iterations equal) is then known once the computation has run (`require`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from partir.core.actions import AnyAction, Sum, Tile
from partir.core.dialect import INDEX, LOOP, SLICE
from partir.ir import Function, Op, Region, Value
from partir.ir.evaluate import evaluate
from partir.ir.monoids import MONOIDS
from partir.ir.types import tile_size
from partir.rules.catalogue import region_ops
from partir.rules.collectives import NAMED_AXIS_OPS, named_axes


class InterpreterError(Exception):
    pass


def pad_dim(x: Any, dim: int, size: int) -> Any:
    """x with dimension `dim` padded at its end to `size` (with zeros: the values there
    are arbitrary, and nothing correct may depend on them)."""
    if x.shape[dim] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, size - x.shape[dim])
    return jnp.pad(x, widths)


def combine(action, parts: list[Any], size: int | None = None) -> Any:
    """The result of a loop (or of a stacked axis) from its iterations' results; a
    `#tile` result is truncated to `size` when the tiles pad its dimension."""
    if isinstance(action, Tile):
        out = jnp.concatenate(parts, axis=action.dim)
        if size is not None and size != out.shape[action.dim]:
            out = lax.slice_in_dim(out, 0, size, axis=action.dim)
        return out
    if isinstance(action, Sum):
        acc = parts[0]
        for p in parts[1:]:
            acc = MONOIDS[action.monoid].combine(acc, p)
        return acc
    assert isinstance(action, AnyAction)
    first = _comparable(parts[0])
    require(jnp.all(jnp.asarray([jnp.array_equal(first, _comparable(p), equal_nan=True)
                                 for p in parts[1:]], bool)),
            InterpreterError("iterations of an `any` loop computed different values"))
    return parts[0]


def _comparable(x: Any) -> Any:
    """x, a typed PRNG key array as its key data, which has no equality."""
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return x


# The conditions `require`d in the traced run `checked` is making (None: none is), with
# the error each raises; whether the values being traced are one coordinate's of a
# lockstep run (`in_lockstep`).
_REQUIRED: ContextVar[list[tuple[Any, Exception]] | None] = ContextVar("required",
                                                                        default=None)
_IN_LOCKSTEP: ContextVar[bool] = ContextVar("in_lockstep", default=False)


def require(ok: Any, error: Exception) -> None:
    """Raise `error` unless `ok`, a condition on the values computed: at once where they
    are known, after the computation in a traced run (`checked`). Inside a lockstep run
    (vmapped) it is not checked: each coordinate has its own."""
    if _IN_LOCKSTEP.get():
        return
    if isinstance(ok, jax.core.Tracer):
        required = _REQUIRED.get()
        if required is not None:
            required.append((ok, error))
        return
    if not ok:
        raise error


def checked(f: Callable[..., Any]) -> Callable[..., Any]:
    """f run as one computation (`jax.jit`), raising the first error of the conditions
    it `require`d that do not hold."""
    def run(*args: Any) -> Any:
        required: list[tuple[Any, Exception]] = []

        def traced(*xs: Any) -> tuple[Any, list[Any]]:
            token = _REQUIRED.set(required)
            try:
                return f(*xs), [ok for ok, _ in required]
            finally:
                _REQUIRED.reset(token)

        outs, oks = jax.jit(traced)(*args)
        for ok, (_, error) in zip(oks, required, strict=True):
            if not ok:
                raise error
        return outs
    return run


def eval_op(op: Op, env: Mapping[Value, Any]) -> list[Any]:
    """A Core op without regions: `slice`, `index`, `tag`, `constant` or a primitive, with
    range values in `env` bound to loop indices (or device coordinates)."""
    if op.name == SLICE:
        x, r = (env[v] for v in op.operands)
        n = op.operands[1].type.size
        dim = op.params["dim"]
        chunk = tile_size(x.shape[dim], n)
        return [lax.dynamic_slice_in_dim(pad_dim(x, dim, chunk * n), r * chunk, chunk, dim)]
    if op.name == INDEX:
        return [jnp.asarray(env[op.operands[0]], jnp.int32)]
    return evaluate(op, [env[v] for v in op.operands])


def lockstep_axes(op: Op) -> frozenset[str]:
    """The mesh axes along which the op's instances must run together: those the
    collectives in its regions name."""
    if not op.regions:
        return frozenset()
    return frozenset(axis for inner, _ in region_ops(op) if inner.name in NAMED_AXIS_OPS
                     for axis in named_axes(inner))


def in_lockstep(f: Callable[..., Any], axes: Sequence[str], *stacked: Any) -> Any:
    """f run at every coordinate of `axes` at once, each axis a named vmap axis: every
    argument has one leading dimension per axis, and so does every result."""
    for axis in reversed(axes):
        f = jax.vmap(f, axis_name=axis)
    token = _IN_LOCKSTEP.set(True)
    try:
        return f(*stacked)
    finally:
        _IN_LOCKSTEP.reset(token)


class Interpreter:
    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self._named: dict[int, frozenset[str]] = {}  # id(region) -> axes its ops name
        self._bound: tuple[str, ...] = ()  # the axes of the lockstep loops around

    def __call__(self, *args: Any) -> list[Any]:
        if len(args) != len(self.fn.args):
            raise InterpreterError(f"expected {len(self.fn.args)} arguments, got {len(args)}")
        env: dict[Value, Any] = {}
        for a, x in zip(self.fn.args, args, strict=True):
            if tuple(np.shape(x)) != a.type.shape:
                raise InterpreterError(f"argument %{a.name} has shape {np.shape(x)}, "
                                       f"expected {a.type.shape}")
            env[a] = jnp.asarray(x)
        self._run(self.fn.ops, env)
        return [env[v] for v in self.fn.results]

    def _run(self, ops: Sequence[Op], env: dict[Value, Any]) -> None:
        for op in ops:
            outs = self._eval(op, env)
            for r, o in zip(op.results, outs, strict=True):
                env[r] = o

    def _eval(self, op: Op, env: dict[Value, Any]) -> list[Any]:
        if op.name == LOOP:
            return self._loop(op, env)
        return eval_alike(op, env, self._bound, self._mesh)

    def _mesh(self) -> dict[str, int]:
        """The axes' sizes (the function's `mesh` attribute, as materialize writes it)."""
        mesh = self.fn.attributes.get("mesh")
        if isinstance(mesh, str):
            mesh = json.loads(mesh)
        if not isinstance(mesh, Mapping):
            raise InterpreterError(f"@{self.fn.name} has no mesh attribute to run its "
                                   f"collectives' axes with")
        return dict(mesh)

    def _axes(self, region: Region) -> frozenset[str]:
        """The axes the collectives inside the region's ops name, nested loops included."""
        found = self._named.get(id(region))
        if found is None:
            found = frozenset().union(*(
                self._axes(op.regions[0]) if op.name == LOOP else lockstep_axes(op)
                for op in region.ops))
            self._named[id(region)] = found
        return found

    def _loop(self, op: Op, env: dict[Value, Any]) -> list[Any]:
        region: Region = op.regions[0]
        (r,) = region.args
        size = op.params["size"]

        def body(i: Any) -> list[Any]:
            inner = dict(env)
            inner[r] = i
            self._run(region.ops, inner)
            return [inner[v] for v in region.yields]

        if op.params["axis"] in self._axes(region):
            bound = self._bound
            self._bound = (*bound, op.params["axis"])
            try:
                stacked = in_lockstep(body, [op.params["axis"]],
                                      jnp.arange(size, dtype=jnp.int32))
            finally:
                self._bound = bound
            per_iter = [[s[i] for s in stacked] for i in range(size)]
        else:
            per_iter = [body(i) for i in range(size)]
        return [combine(a, [it[k] for it in per_iter],
                        res.type.shape[a.dim] if isinstance(a, Tile) else None)
                for k, (a, res) in enumerate(zip(op.params["actions"], op.results,
                                                 strict=True))]


def eval_alike(op: Op, env: Mapping[Value, Any], bound: Sequence[str],
               sizes: Callable[[], Mapping[str, int]]) -> list[Any]:
    """`eval_op`, for an op whose regions may hold collectives over axes that no loop (or
    execute) around it runs in lockstep (`bound` are those that do): every device of
    those axes runs it alike (its operands and results do not differ along them), one
    vmapped instance per coordinate, and the first instance's results are its results.
    `sizes()`: the axes' sizes, asked only then."""
    axes = sorted(lockstep_axes(op) - set(bound)) if op.regions else ()
    if not axes:
        return eval_op(op, env)
    mesh = sizes()
    coords = jnp.meshgrid(*[jnp.arange(mesh[a], dtype=jnp.int32) for a in axes],
                          indexing="ij")
    outs = in_lockstep(lambda *_: eval_op(op, env), axes, *coords)
    return [o.reshape((-1, *o.shape[len(axes):]))[0] for o in outs]


def interpret(fn: Function, *args: Any) -> list[Any]:
    """Run a Core function on arguments; returns its results. The ops run in order, as one
    computation (`checked`)."""
    return checked(Interpreter(fn))(*args)
