"""`partir.jit`: a function partitioned by a schedule and run on local devices, compiled
per argument signature like `jax.jit`."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

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
                                                    self.static_argnums)
            executable = build_callable(
                final.hlo, self.jax_mesh, donate_argnums=self._donated_leaves(args),
                keep_unused=self.options.keep_unused,
                compiler_options=self.options.compiler_options or None)
            meta.stablehlo = Deferred(lambda: executable.lower().as_text())
            found = self._compiled[key] = _Compiled(result, meta, executable)
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
        compiled, leaves = self._executable(self._positional(args, kwargs))
        outs = compiled.executable.fun(*compiled.executable.layout(leaves))
        return jax.tree_util.tree_unflatten(compiled.partition.traced.out_tree, outs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(...).lower`: `.compile()`, `.as_text()`, `memory_analysis()`."""
        compiled, leaves = self._executable(self._positional(args, kwargs))
        lowered = compiled.executable.lower(*leaves)
        self.metadata.stablehlo = lowered.as_text()
        return lowered


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
    `donate_argnames`, `keep_unused` and `compiler_options` (`in_shardings` and
    `out_shardings` are refused: the schedule decides them)."""
    options = resolve_jit_options(fn, jit_options)
    # A jax.sharding.Mesh says which device holds which tile: the program runs on it.
    jax_mesh = mesh if isinstance(mesh, jax.sharding.Mesh) else None
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    meta = Metadata()
    return PartitionedFunction(fn, mesh, schedule, meta, options, jax_mesh), meta
