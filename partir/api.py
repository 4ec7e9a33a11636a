"""Public entry points.

`core_partition` traces a function, applies a schedule and gives the PartIR:Core program
after every tactic, with the actions issued and the conflicts met, and runs it on the
sequential interpreter. `partition` also lowers every tactic's program to PartIR:HLO and
reports `Metadata` without devices (`partir.jitted.jit` runs it on local devices).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from partir.core.conflicts import UNSUPPORTED, Conflict
from partir.core.interpreter import interpret
from partir.core.materialize import materialize
from partir.core.padding import padding_report
from partir.core.printing import print_core
from partir.core.program import CoreProgram
from partir.errors import TracingError
from partir.frontend import TracedProgram, trace
from partir.gcpause import paused_gc
from partir.mesh import Mesh
from partir.metadata import Deferred, Metadata, TacticMetadata
from partir.pipeline import Lowered, lower
from partir.runtime.specs import partition_spec
from partir.sim import DEFAULT_DEVICE, DeviceSpec, get_device, simulate
from partir.tactics import (
    ManualPartition,
    TacticRecord,
    annotation_notes,
    apply_schedule,
    as_schedule,
    pipelined,
)
from partir.tactics.outputs import OutShardings, check_out_shardings
from partir.tactics.search import register_evaluator


def _search_evaluator(device: str | None) -> tuple[str, Callable[[CoreProgram], Any]]:
    """AutomaticPartition's evaluator: lower the program to PartIR:HLO and simulate it."""
    spec = get_device(device or DEFAULT_DEVICE)
    return spec.name, lambda program: simulate(lower(program).hlo, spec)


register_evaluator(_search_evaluator)


@dataclass
class CorePartition:
    traced: TracedProgram
    mesh: Mesh
    initial: CoreProgram
    tactics: list[TacticRecord]
    frontend_s: float
    # On the program rather than a tactic: the model's sharding annotations the schedule
    # ignores (`annotation_notes`), one per line, whatever the number of tactics.
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def program(self) -> CoreProgram:
        return self.tactics[-1].program if self.tactics else self.initial

    def program_after(self, after: int | None = None) -> CoreProgram:
        """The Core program after tactic `after` (1-based; 0 is the traced program;
        default: the last)."""
        if after is None:
            return self.program
        return self.initial if after == 0 else self.tactics[after - 1].program

    def core_ir(self, after: int | None = None) -> str:
        """Core IR after tactic `after` (1-based; 0 is the traced program; default: last)."""
        return print_core(self.program_after(after))

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
        outs = interpret(materialize(self.program_after(after)), *self.flatten_args(*args))
        return jax.tree_util.tree_unflatten(self.traced.out_tree, outs)


def core_partition(fn: Callable, mesh: Mesh | Any,
                   schedule: Sequence[ManualPartition] | ManualPartition,
                   *args: Any, static_argnums: Sequence[int] = (),
                   out_shardings: Any = None) -> CorePartition:
    """Trace `fn(*args)` and apply `schedule` (tactics, or one tactic) on `mesh`,
    returning the Core program after each tactic. Arguments may be arrays or
    `jax.ShapeDtypeStruct`s. `out_shardings`, as `jax.jit`'s (a pytree prefix of the
    outputs of `PartitionSpec`s, None where unconstrained), is one more tactic after the
    schedule (`partir.tactics.OutShardings`)."""
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    start = time.perf_counter()
    traced = trace(fn, *args, static_argnums=static_argnums)
    frontend_s = time.perf_counter() - start
    tactics = as_schedule(schedule)
    constraint = None if out_shardings is None else OutShardings.of(out_shardings, traced)
    if constraint is not None:
        tactics = [*tactics, constraint]
    traced = pipelined(traced, mesh, tactics)
    initial, records = apply_schedule(traced, mesh, tactics)
    return CorePartition(traced, mesh, initial, records, frontend_s,
                         annotation_notes(traced, tactics))


def _specs(shardings: Sequence, tree: Any, mesh: Mesh) -> tuple:
    """The PartitionSpecs of the user's mesh: sub-axes an axis was split into are named
    by that axis where a dimension has all of them in order (else by their Shardy names,
    which are axes of the executable's `jax_mesh`)."""
    # One spec per distinct sharding: a model's parameters and optimizer state, by the
    # thousand, share a few (the specs are immutable, so the leaves may share them).
    made: dict[tuple, jax.sharding.PartitionSpec] = {}
    specs = []
    for s in shardings:
        spec = made.get(s)
        if spec is None:
            spec = made[s] = partition_spec(tuple(mesh.coalesce(a) for a in s))
        specs.append(spec)
    out = jax.tree_util.tree_unflatten(tree, specs)
    return out if isinstance(out, tuple) else (out,)


def tactic_shardings(program: CoreProgram) -> dict[str, list[list[str]]]:
    """Each input's and output's sharding: per dimension, the mesh axes major to minor."""
    return {name: [list(axes) for axes in s.dims]
            for name, s in {**program.input_shardings(), **program.output_shardings()}.items()}


# The fields of TacticMetadata that lowering and simulating the program fill in;
# `applied_metadata` leaves them empty.
LOWERED_FIELDS = ("collectives", "executed_collectives", "cost")


def applied_metadata(record: TacticRecord, *, defer: bool = False) -> TacticMetadata:
    """What applying a tactic tells, without lowering its program: no `collectives` (an
    empty dict), no `cost`, no `core_ir`. Tools show it first, as it is fast. With
    `defer`, the shardings are computed when first read."""
    meta = TacticMetadata(record.name, record.axis, record.actions, {}, {},
                          Deferred(lambda: tactic_shardings(record.program)),
                          [c.to_json() for c in record.conflicts], record.notes, "",
                          record.elapsed_s, search=record.search, pipeline=record.pipeline,
                          padding=Deferred(lambda: padding_report(record.program)))
    if not defer:
        with paused_gc():
            meta.shardings  # noqa: B018
            meta.padding  # noqa: B018
    return meta


def tactic_metadata(record: TacticRecord, device: str | DeviceSpec = DEFAULT_DEVICE, *,
                    core_ir: bool = True, lowered: Lowered | None = None,
                    applied: TacticMetadata | None = None,
                    defer: bool = False) -> TacticMetadata:
    """What partitioning reports for one tactic: its program lowered to PartIR:HLO (unless
    `lowered` already is) for the collectives and simulated for the cost. Printing the
    Core program of a large model costs more than lowering it: tools that show it on
    request pass `core_ir=False`. Tools that hold the tactic's `applied_metadata` pass
    it, so that only what lowering adds is computed. With `defer`, the shardings, the
    lowering, the simulation and the text are computed when their fields are first read."""
    shared = Deferred(lambda: lowered or lower(record.program))
    lowered_fields = {
        "collectives": Deferred(lambda: shared.get().collectives),
        "executed_collectives": Deferred(lambda: shared.get().executed_collectives),
        "cost": Deferred(lambda: simulate(shared.get().hlo, device)),
        "core_ir": Deferred(record.core_ir) if core_ir else ""}
    if applied is not None:
        meta = dataclasses.replace(applied, **lowered_fields)
    else:
        meta = applied_metadata(record, defer=True)
        vars(meta).update(lowered_fields)
    if not defer:
        with paused_gc():
            for name in (*LOWERED_FIELDS, "core_ir", "shardings"):
                getattr(meta, name)
    return meta


def partition_program(fn: Callable, mesh: Mesh, schedule: Sequence[ManualPartition],
                      args: tuple, static_argnums: Sequence[int],
                      device: str | DeviceSpec = DEFAULT_DEVICE, out_shardings: Any = None
                      ) -> tuple[CorePartition, Metadata, Lowered]:
    """The Core partition, its `Metadata` and the final program's lowering. The final
    program is lowered and simulated at once (its errors are the caller's); the texts and
    the earlier tactics' collectives and costs wait until they are read."""
    device = get_device(device)  # an unknown name fails before any work
    with paused_gc():
        result = core_partition(fn, mesh, schedule, *args, static_argnums=static_argnums,
                                out_shardings=out_shardings)
        final = lower(result.program)
        cost = simulate(final.hlo, device)
        tactics = [tactic_metadata(record, device, defer=True) for record in result.tactics]
        # Counted once (each count walks the program) for both records, as `cost` is.
        collectives, executed = final.collectives, final.executed_collectives
        if tactics:  # the last tactic's program is the final one
            vars(tactics[-1]).update(collectives=collectives, executed_collectives=executed,
                                     cost=cost)
        meta = Metadata(
            tactics=tactics,
            in_specs=_specs(final.hlo.attributes["in_shardings"], result.traced.in_tree,
                            result.program.mesh),
            out_specs=_specs(final.hlo.attributes["out_shardings"], result.traced.out_tree,
                             result.program.mesh),
            core_ir=Deferred(lambda: final.text("core")),
            spmd_ir=Deferred(lambda: final.text("spmd")),
            hlo_ir=Deferred(lambda: final.text("hlo")),
            collectives=collectives, executed_collectives=executed, cost=cost,
            padding=Deferred(lambda: padding_report(result.program)), notes=result.notes)
    return result, meta, final


def partition(fn: Callable, mesh: Mesh | Any,
              schedule: Sequence[ManualPartition] | ManualPartition, *args: Any,
              static_argnums: Sequence[int] = (),
              device: str | DeviceSpec = DEFAULT_DEVICE, out_shardings: Any = None) -> Metadata:
    """Partition `fn(*args)` without devices: arguments may be `jax.ShapeDtypeStruct`s and
    the mesh may be larger than the local device count. `device` names the spec the
    simulator estimates `cost` for (`partir.sim.registered_devices()`, e.g. "h100");
    `out_shardings` is `partir.jit`'s."""
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    return partition_program(fn, mesh, schedule, args, static_argnums, device,
                             check_out_shardings(out_shardings))[1]
