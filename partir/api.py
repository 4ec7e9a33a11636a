"""Public entry points.

`core_partition` traces a function, applies a schedule and gives the PartIR:Core program
after every tactic, with the actions issued and the conflicts met, and runs it on the
sequential interpreter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from partir.core.conflicts import UNSUPPORTED, Conflict
from partir.core.interpreter import interpret
from partir.core.materialize import materialize
from partir.core.printing import print_core
from partir.core.program import CoreProgram
from partir.errors import TracingError
from partir.frontend import TracedProgram, trace
from partir.mesh import Mesh
from partir.tactics import ManualPartition, TacticRecord, apply_schedule


@dataclass
class CorePartition:
    traced: TracedProgram
    mesh: Mesh
    initial: CoreProgram
    tactics: list[TacticRecord]
    frontend_s: float

    @property
    def program(self) -> CoreProgram:
        return self.tactics[-1].program if self.tactics else self.initial

    def core_ir(self, after: int | None = None) -> str:
        """Core IR after tactic `after` (1-based; 0 is the traced program; default: last)."""
        prog = self.program if after is None else (
            self.initial if after == 0 else self.tactics[after - 1].program)
        return print_core(prog)

    @property
    def conflicts(self) -> list[Conflict]:
        return [c for t in self.tactics for c in t.conflicts]

    @property
    def unsupported(self) -> list[Conflict]:
        return [c for c in self.conflicts if c.kind == UNSUPPORTED]

    def flatten_args(self, *args: Any) -> list[Any]:
        dyn = [a for i, a in enumerate(args) if i not in self.traced.static_argnums]
        leaves, tree = jax.tree_util.tree_flatten(tuple(dyn))
        if tree != self.traced.in_tree:
            raise TracingError(f"arguments have structure {tree}, but the function was traced "
                               f"with {self.traced.in_tree}")
        for name, leaf, t in zip(self.traced.input_names, leaves, self.traced.in_types,
                                 strict=True):
            if tuple(np.shape(leaf)) != t.shape:
                raise TracingError(f"input {name!r} has shape {list(np.shape(leaf))}, but the "
                                   f"function was traced with {list(t.shape)}")
        return leaves

    def interpret(self, *args: Any, after: int | None = None) -> Any:
        """Run the Core program (after tactic `after`) on the sequential interpreter."""
        prog = self.program if after is None else (
            self.initial if after == 0 else self.tactics[after - 1].program)
        outs = interpret(materialize(prog), *self.flatten_args(*args))
        return jax.tree_util.tree_unflatten(self.traced.out_tree, outs)


def core_partition(fn: Callable, mesh: Mesh | Any, schedule: Sequence[ManualPartition],
                   *args: Any, static_argnums: Sequence[int] = ()) -> CorePartition:
    """Trace `fn(*args)` and apply `schedule` on `mesh`, returning the Core program after
    each tactic. Arguments may be arrays or `jax.ShapeDtypeStruct`s."""
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    start = time.perf_counter()
    traced = trace(fn, *args, static_argnums=static_argnums)
    frontend_s = time.perf_counter() - start
    initial, records = apply_schedule(traced, mesh, list(schedule))
    return CorePartition(traced, mesh, initial, records, frontend_s)
