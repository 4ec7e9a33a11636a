"""`partir.jit`: a function partitioned by a schedule and run on local devices, compiled
per argument signature like `jax.jit`.

Differentiation. JAX must not differentiate the partitioned program: it would
differentiate the bodies of `custom_jvp`/`custom_vjp` functions (inlined when traced)
instead of their rules, and it has no rule for the `pmax`/`pmin` of a reduction over a
sharded dimension. So a call on tracers (under `jax.grad`, `jax.jit`, `jax.vmap`...) is a
`jax.custom_vjp` whose forward is the partitioned program and whose backward is the
partitioned program of JAX's own VJP of the unpartitioned function
(`PartitionedFunction.vjp`: `(cotangent, *args) -> cotangents of args`, under the same
schedule; its inputs keep the function's parameter names, so the schedule resolves
there too). The residuals are the primal inputs as given, which the backward lays out
as its program needs: it recomputes the forward, like `jax.checkpoint` around the whole
function, so no residual's sharding has to be agreed between the two programs. That
backward is itself a `PartitionedFunction`, so differentiating it again (grad of grad)
goes through its own VJP. Forward mode (`jax.jvp`, `jax.linearize`, `jacfwd`,
`hessian`) is refused by JAX, as for any `custom_vjp` function. A `custom_jvp` instead
would trace `jax.jvp` of the function, which JAX refuses wherever the function holds a
`custom_vjp`, so reverse mode could not rest on it; and choosing by the kind of tracer
would make `jax.jvp(jax.jit(fn))` fail where `jax.jit(jax.jvp(fn))` works. Calls on arrays
run the executable directly, and a traced call that is never differentiated only traces
the forward program (JAX builds the VJP lazily), so neither compiles anything more.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from partir.api import CorePartition, partition_program
from partir.errors import TracingError
from partir.jit_options import JitOptions, resolve_jit_options
from partir.mesh import Mesh
from partir.metadata import Deferred, Metadata
from partir.runtime import Executable, build_callable
from partir.tactics import ManualPartition, as_schedule


@dataclass(frozen=True)
class _Compiled:
    """One argument signature's partition, metadata and executable."""

    partition: CorePartition
    metadata: Metadata
    executable: Executable
    # The executable without donation, which a differentiated call's forward runs: its
    # inputs are the residuals the backward program reads (`executable` itself where
    # nothing is donated; built on first use otherwise).
    undonated: Deferred[Executable]


class PartitionedFunction:
    """`fn` partitioned by a schedule, compiled per argument signature like `jax.jit`:
    the first call with new shapes traces, partitions, lowers and compiles.

    A call reads only its arguments' avals, so it moves no data to the host and runs on
    tracers too (under `jax.jit` or `jax.grad`): arrays already
    laid out as the program's inputs pass through, others are placed on the mesh."""

    def __init__(self, fn: Callable, mesh: Mesh, schedule: Sequence[ManualPartition],
                 metadata: Metadata, options: JitOptions,
                 jax_mesh: jax.sharding.Mesh | None = None) -> None:
        self.fn = fn
        self.mesh = mesh
        self.schedule = as_schedule(schedule)
        self.metadata = metadata
        self.options = options
        self.static_argnums = options.static_argnums
        self.jax_mesh = jax_mesh
        self._compiled: dict[Any, _Compiled] = {}
        self._last: Any = None
        self._vjp: PartitionedFunction | None = None

    def _signature(self, args: tuple) -> tuple[Any, list[Any]]:
        """The cache key of `args` (static arguments, pytree structure, and each leaf's
        shape, dtype and weak type: what tracing depends on; not its sharding, as the
        program is traced without it) and their flat dynamic leaves."""
        static, dynamic = [], []
        for i, a in enumerate(args):
            (static if i in self.static_argnums else dynamic).append(a)
        leaves, tree = jax.tree_util.tree_flatten(tuple(dynamic))
        try:
            avals = tuple(_aval_key(x) for x in leaves)
        except TypeError as e:  # a leaf that is no array, as jax.jit says
            raise TracingError(f"{getattr(self.fn, '__name__', self.fn)}: {e}") from None
        key = (tuple(static), tree, avals)
        try:
            hash(key)
        except TypeError:  # unhashable static arguments
            key = repr(key)
        return key, leaves

    def _executable(self, args: tuple) -> tuple[_Compiled, list[Any]]:
        key, leaves = self._signature(args)
        found = self._compiled.get(key)
        if found is None:
            result, meta, final = partition_program(self.fn, self.mesh, self.schedule, args,
                                                    self.static_argnums,
                                                    out_shardings=self.options.out_shardings)
            executable = build_callable(
                final.hlo, self.jax_mesh, donate_argnums=self._donated_leaves(args),
                keep_unused=self.options.keep_unused,
                compiler_options=self.options.compiler_options or None)
            meta.stablehlo = Deferred(lambda: executable.lower().as_text())
            undonated = Deferred(lambda: executable) if not self.options.donate_argnums \
                else Deferred(lambda: build_callable(
                    final.hlo, self.jax_mesh, keep_unused=self.options.keep_unused,
                    compiler_options=self.options.compiler_options or None))
            found = self._compiled[key] = _Compiled(result, meta, executable, undonated)
        if key != self._last:  # the metadata describes the signature last used
            vars(self.metadata).update(vars(found.metadata))
            self._last = key
        return found, leaves

    def _donated_leaves(self, args: tuple) -> tuple[int, ...]:
        """The flat input positions of the leaves of the donated arguments."""
        out, start = [], 0
        for i, a in enumerate(args):
            if i in self.static_argnums:
                continue
            n = len(jax.tree_util.tree_leaves(a))
            if i in self.options.donate_argnums:
                out.extend(range(start, start + n))
            start += n
        return tuple(out)

    def _positional(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """Arguments given by keyword, put in their positions as `jax.jit` does."""
        if not kwargs:
            return args
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise TracingError(f"{getattr(self.fn, '__name__', self.fn)}: {e}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise TracingError(f"keyword-only arguments {sorted(bound.kwargs)} are not "
                               f"supported: pass them positionally or close over them")
        return bound.args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self._positional(args, kwargs)
        compiled, leaves = self._executable(args)
        outs = self._run(compiled, compiled.executable, args, leaves)
        return jax.tree_util.tree_unflatten(compiled.partition.traced.out_tree, outs)

    @property
    def vjp(self) -> PartitionedFunction:
        """The partitioned VJP that differentiating a call runs: `vjp(cotangent, *args)`
        gives the cotangents of the arguments (a tuple of the dynamic arguments' pytrees,
        `None` at leaves that are not floating point), from the cotangent of the output
        (`None` at non-floating-point leaves). Its `metadata` describes the backward
        program of the signature last differentiated."""
        if self._vjp is None:
            static = tuple(i + 1 for i in self.static_argnums)
            options = JitOptions(static_argnums=static, keep_unused=self.options.keep_unused,
                                 compiler_options=self.options.compiler_options)
            self._vjp = PartitionedFunction(_vjp_of(self.fn, self.static_argnums), self.mesh,
                                            self.schedule, Metadata(), options, self.jax_mesh)
        return self._vjp

    def _run(self, compiled: _Compiled, executable: Executable, args: tuple,
             leaves: Sequence[Any]) -> Sequence[Any]:
        """The flat outputs of `executable` (`compiled`'s, or its undonated copy) on the
        flat dynamic `leaves` of `args`: run directly on arrays; on tracers, as a
        `jax.custom_vjp` whose VJP is `self.vjp` (see the module's docstring)."""
        if not any(isinstance(x, jax.core.Tracer) for x in leaves):
            return executable.fun(*executable.layout(leaves))
        in_tree = compiled.partition.traced.in_tree
        out_tree = compiled.partition.traced.out_tree

        @jax.custom_vjp
        def call(*leaves: Any) -> tuple:
            return tuple(executable.fun(*executable.layout(leaves)))

        def forward(*leaves: Any) -> tuple[tuple, tuple]:
            # Under higher-order differentiation the leaves are tracers of the outer
            # differentiation, which differentiates the forward: it is a call again. It
            # donates nothing, as the backward reads its inputs.
            return tuple(self._run(compiled, compiled.undonated.get(), args, leaves)), leaves

        def backward(leaves: tuple, cotangents: tuple) -> tuple:
            dynamic = iter(jax.tree_util.tree_unflatten(in_tree, leaves))
            full = [a if i in self.static_argnums else next(dynamic)
                    for i, a in enumerate(args)]
            # Integer and boolean outputs have float0 cotangents, which no program takes.
            cts = [None if c.dtype == jax.dtypes.float0 else c for c in cotangents]
            grads = self.vjp(jax.tree_util.tree_unflatten(out_tree, cts), *full)
            return tuple(jax.tree_util.tree_leaves(grads, is_leaf=_is_none))

        call.defvjp(forward, backward)
        return call(*leaves)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(...).lower`: `.compile()`, `.as_text()`, `memory_analysis()`."""
        compiled, leaves = self._executable(self._positional(args, kwargs))
        lowered = compiled.executable.lower(*leaves)
        self.metadata.stablehlo = lowered.as_text()
        return lowered


def _is_none(x: Any) -> bool:
    return x is None


def _differentiable_dtype(x: Any) -> bool:
    return jax.numpy.issubdtype(jax.typeof(x).dtype, jax.numpy.inexact)


def _vjp_of(fn: Callable, static_argnums: tuple[int, ...]) -> Callable:
    """`(cotangent, *args) -> cotangents of args`: JAX's VJP of the unpartitioned `fn`
    (its custom rules honoured), to be partitioned like `fn`. The cotangent comes first so
    that the arguments keep their positions' names (and `*args` its numbering) and the
    schedule's inputs resolve as in `fn`'s program; it is named `cotangent`, or with
    underscores added where a parameter has that name."""

    def vjp(cotangent: Any, *args: Any) -> tuple:
        dyn_pos = [i for i in range(len(args)) if i not in static_argnums]
        leaves, tree = jax.tree_util.tree_flatten(tuple(args[i] for i in dyn_pos))
        wrt = [k for k, x in enumerate(leaves) if _differentiable_dtype(x)]

        def of_differentiable(*diff: Any) -> Any:
            merged = list(leaves)
            for k, d in zip(wrt, diff, strict=True):
                merged[k] = d
            full = list(args)
            for i, d in zip(dyn_pos, jax.tree_util.tree_unflatten(tree, merged), strict=True):
                full[i] = d
            return fn(*full)

        out, pullback = jax.vjp(of_differentiable, *(leaves[k] for k in wrt))
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        given = jax.tree_util.tree_leaves(cotangent, is_leaf=_is_none)
        cts = [np.zeros(jax.typeof(o).shape, jax.dtypes.float0) if c is None else c
               for o, c in zip(out_leaves, given, strict=True)]
        grads: list[Any] = [None] * len(leaves)
        for k, g in zip(wrt, pullback(jax.tree_util.tree_unflatten(out_tree, cts)),
                        strict=True):
            grads[k] = g
        return jax.tree_util.tree_unflatten(tree, grads)

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        # The forward program's inputs were then named by position (arg0, ...), which the
        # VJP's could not keep behind a leading cotangent.
        raise TracingError(f"cannot differentiate {fn!r}: its signature, which names the "
                           f"VJP program's inputs as the schedule expects, cannot be read "
                           f"({e}); wrap it in a function with named parameters") from None
    ct_name = "cotangent"
    while any(p.name == ct_name for p in params):
        ct_name += "_"
    ct = inspect.Parameter(ct_name, inspect.Parameter.POSITIONAL_ONLY)
    vjp.__signature__ = inspect.Signature([ct, *params])  # type: ignore[attr-defined]
    name = getattr(fn, "__name__", "main")
    vjp.__name__ = f"{name}_vjp" if name.isidentifier() else "vjp"
    return vjp


def _aval_key(x: Any) -> tuple[Any, ...]:
    aval = jax.typeof(x)
    return aval.shape, aval.dtype, aval.weak_type


def jit(fn: Callable, mesh: Mesh | Any, schedule: Sequence[ManualPartition] | ManualPartition,
        **jit_options: Any) -> tuple[PartitionedFunction, Metadata]:
    """`fn` partitioned by `schedule` (tactics, or one tactic) on the local devices of
    `mesh`: a `jax.sharding.Mesh` is used with its device order, a `partir.Mesh` (or
    mapping of axis sizes) lays `jax.devices()` out row-major.

    Returns the partitioned function and its `Metadata`, which is filled when the function
    is first called or lowered (as `jax.jit` traces on first use). Keyword arguments are
    `jax.jit`'s: `static_argnums`, `static_argnames`, `donate_argnums`,
    `donate_argnames`, `keep_unused`, `compiler_options` and `out_shardings` (a pytree
    prefix of the outputs of `PartitionSpec`s, None where unconstrained: each output
    comes back with exactly its spec's sharding, by one more tactic after the schedule,
    `partir.tactics.OutShardings`; `in_shardings` is refused: the schedule decides it)."""
    options = resolve_jit_options(fn, jit_options)
    # A jax.sharding.Mesh says which device holds which tile: the program runs on it.
    jax_mesh = mesh if isinstance(mesh, jax.sharding.Mesh) else None
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    meta = Metadata()
    return PartitionedFunction(fn, mesh, schedule, meta, options, jax_mesh), meta
