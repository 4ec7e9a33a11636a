"""`partir.jit`: a function partitioned by a schedule and run on local devices, compiled
per argument signature like `jax.jit`."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from partir.api import CorePartition, partition_program
from partir.errors import TracingError
from partir.jit_options import JitOptions, resolve_jit_options
from partir.mesh import Mesh
from partir.metadata import Metadata
from partir.runtime import build_callable
from partir.tactics import ManualPartition


class PartitionedFunction:
    """`fn` partitioned by a schedule, compiled per argument signature like `jax.jit`:
    the first call with new shapes traces, partitions, lowers and compiles."""

    def __init__(self, fn: Callable, mesh: Mesh, schedule: Sequence[ManualPartition],
                 metadata: Metadata, options: JitOptions) -> None:
        self.fn = fn
        self.mesh = mesh
        self.schedule = list(schedule)
        self.metadata = metadata
        self.options = options
        self.static_argnums = options.static_argnums
        self._compiled: dict[Any, tuple[CorePartition, Any, Metadata]] = {}
        self._last: Any = None

    def _executable(self, args: tuple) -> tuple[CorePartition, Any]:
        key = tuple(
            a if i in self.static_argnums else jax.tree_util.tree_map(
                lambda x: (tuple(np.shape(x)), str(getattr(x, "dtype", np.asarray(x).dtype))),
                a)
            for i, a in enumerate(args))
        try:
            hash(key)
        except TypeError:
            key = repr(key)
        found = self._compiled.get(key)
        if found is None:
            result, meta, final = partition_program(self.fn, self.mesh, self.schedule, args,
                                             self.static_argnums)
            executable = build_callable(
                final.hlo, donate_argnums=self._donated_leaves(args),
                keep_unused=self.options.keep_unused,
                compiler_options=self.options.compiler_options or None)
            found = self._compiled[key] = (result, executable, meta)
        if key != self._last:  # the metadata describes the signature last used
            vars(self.metadata).update(vars(found[2]))
            self._last = key
        return found[0], found[1]

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
        result, executable = self._executable(args)
        outs = executable(*result.flatten_args(*args))
        return jax.tree_util.tree_unflatten(result.traced.out_tree, outs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(...).lower`: `.compile()`, `.as_text()`, `memory_analysis()`."""
        args = self._positional(args, kwargs)
        result, executable = self._executable(args)
        lowered = executable.lower(*result.flatten_args(*args))
        self.metadata.stablehlo = lowered.as_text()
        return lowered


def jit(fn: Callable, mesh: Mesh | Any, schedule: Sequence[ManualPartition],
        **jit_options: Any) -> tuple[PartitionedFunction, Metadata]:
    """`fn` partitioned by `schedule` on the local devices of `mesh`.

    Returns the partitioned function and its `Metadata`, which is filled when the function
    is first called or lowered (as `jax.jit` traces on first use). Keyword arguments are
    `jax.jit`'s: `static_argnums`, `static_argnames`, `donate_argnums`,
    `donate_argnames`, `keep_unused` and `compiler_options` (`in_shardings` and
    `out_shardings` are refused: the schedule decides them)."""
    options = resolve_jit_options(fn, jit_options)
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    meta = Metadata()
    return PartitionedFunction(fn, mesh, schedule, meta, options), meta
