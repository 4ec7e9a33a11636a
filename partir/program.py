"""`partir.Program`: the function a schedule file partitions, with its example arguments.

A schedule file (`*.partir.py`) defines `program = partir.Program(fn, *example_args)`
next to its `mesh` and `schedule`, so tools can trace the function without running the
user's training script.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from partir.api import CorePartition, core_partition
from partir.errors import PartitionError
from partir.mesh import Mesh
from partir.tactics import ManualPartition


@dataclass(init=False)
class Program:
    """`fn` and example arguments to trace it with (arrays or `jax.ShapeDtypeStruct`s;
    the positions in `static_argnums` are passed to `fn` as Python values)."""

    fn: Callable
    args: tuple[Any, ...]
    static_argnums: tuple[int, ...]

    def __init__(self, fn: Callable, *args: Any, static_argnums: Sequence[int] = ()) -> None:
        if not callable(fn):
            raise PartitionError(f"partir.Program needs the function to partition first, "
                                 f"got {type(fn).__name__}")
        self.fn = fn
        self.args = args
        self.static_argnums = tuple(static_argnums)

    def abstract(self) -> Program:
        """This program with its JAX values (arrays, or tracers when computed under a
        trace) as `jax.ShapeDtypeStruct`s; other leaves (numpy arrays, Python numbers) and
        static arguments as they are. Raises ValueError when a static argument holds a
        tracer: it needs the concrete value."""
        import jax

        def shape_of(leaf: Any) -> Any:
            if isinstance(leaf, jax.Array | jax.core.Tracer):
                aval = leaf.aval
                return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                            weak_type=getattr(aval, "weak_type", False))
            return leaf

        args = []
        for i, arg in enumerate(self.args):
            if i in self.static_argnums:
                if any(isinstance(leaf, jax.core.Tracer)
                       for leaf in jax.tree_util.tree_leaves(arg)):
                    raise ValueError(f"static argument {i} holds a traced value")
                args.append(arg)
            else:
                args.append(jax.tree_util.tree_map(shape_of, arg))
        return Program(self.fn, *args, static_argnums=self.static_argnums)

    def core_partition(self, mesh: Mesh | Any,
                       schedule: Sequence[ManualPartition]) -> CorePartition:
        """`partir.core_partition` of this function and arguments."""
        return core_partition(self.fn, mesh, schedule, *self.args,
                              static_argnums=self.static_argnums)
