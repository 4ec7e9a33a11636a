"""Applies a schedule to a traced program, tactic by tactic, recording after each one the
actions it issued, the conflicts propagation met, and a snapshot of the Core program."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from partir.core.conflicts import Conflict
from partir.core.module import CoreModule
from partir.core.program import CoreProgram
from partir.core.propagation import propagate
from partir.core.value_actions import atomic_value, sharded_dims, tile_value
from partir.errors import InvalidTacticError
from partir.frontend import TracedProgram
from partir.gcpause import paused_gc
from partir.ir import Value
from partir.mesh import Mesh
from partir.tactics.forms import FIRST_DIVISIBLE_DIM, REPLICATED, UNKNOWN
from partir.tactics.manual import ActionSpec, ManualPartition, resolve_form


@dataclass
class TacticRecord:
    name: str
    axis: str
    actions: list[str]
    conflicts: list[Conflict]
    program: CoreProgram
    elapsed_s: float
    propagation_s: float
    notes: list[str] = field(default_factory=list)

    def core_ir(self) -> str:
        from partir.core.printing import print_core
        return print_core(self.program)


def named_values(module: CoreModule, traced: TracedProgram) -> dict[str, list[Value]]:
    names: dict[str, list[Value]] = {n: [v] for n, v in zip(traced.input_names, module.args,
                                                            strict=True)}
    for tag, values in module.tags.items():
        names.setdefault(tag, []).extend(values)
    return names


def expand(tactic: ManualPartition, module: CoreModule,
           names: dict[str, list[Value]]) -> tuple[list[ActionSpec], list[str]]:
    """The actions a ManualPartition issues, and notes on inputs it left alone."""
    module.mesh.check_axis(tactic.axis, tactic=tactic.label, loc=tactic.loc)
    n = module.mesh[tactic.axis]
    specs: list[ActionSpec] = []
    notes: list[str] = []
    for name, value, form in tactic.select(names):
        form = resolve_form(form, name, value.type.shape, tactic.label, tactic.loc)
        if form is UNKNOWN:
            continue
        if form is REPLICATED:
            specs.append(ActionSpec("atomic", name, value, tactic.axis))
        elif form is FIRST_DIVISIBLE_DIM:
            taken = sharded_dims(module, value)
            dims = [d for d, s in enumerate(value.type.shape) if d not in taken and s % n == 0]
            if dims:
                specs.append(ActionSpec("tile", name, value, tactic.axis, dims[0]))
            else:
                notes.append(f"{name} {list(value.type.shape)}: no unsharded dimension divisible "
                             f"by {n}; left as is")
        elif isinstance(form, int):
            specs.append(ActionSpec("tile", name, value, tactic.axis, form))
        else:
            raise InvalidTacticError(f"unsupported value {form!r} for {name!r}",
                                     tactic=tactic.label, loc=tactic.loc)
    return specs, notes


def apply_tactic(module: CoreModule, tactic: ManualPartition,
                 names: dict[str, list[Value]]) -> TacticRecord:
    if not isinstance(tactic, ManualPartition):
        raise InvalidTacticError(f"a schedule holds tactics such as partir.ManualPartition, "
                                 f"got {type(tactic).__name__}")
    with paused_gc():
        return _apply_tactic(module, tactic, names)


def _apply_tactic(module: CoreModule, tactic: ManualPartition,
                  names: dict[str, list[Value]]) -> TacticRecord:
    start = time.perf_counter()
    specs, notes = expand(tactic, module, names)
    before = set(module.conflicts)
    seeds: list[int] = []
    actions: list[str] = []
    for spec in specs:
        label = f"input {spec.name!r}"
        if spec.kind == "tile":
            seeds += tile_value(module, spec.value, spec.dim, spec.axis, label=label,
                                tactic=tactic.label, loc=tactic.loc, pad=tactic.pad)
            spec = ActionSpec("tile", spec.name, spec.value, spec.axis,
                              spec.dim % spec.value.type.rank)
        else:
            seeds += atomic_value(module, spec.value, spec.axis, label=label,
                                  tactic=tactic.label, loc=tactic.loc)
        actions.append(str(spec))
    prop_start = time.perf_counter()
    propagate(module, seeds, pad=tactic.pad)
    actions.append("propagate")
    end = time.perf_counter()
    conflicts = [c for key, c in module.conflicts.items() if key not in before]
    return TacticRecord(tactic.label, tactic.axis, actions, conflicts, module.snapshot(),
                        end - start, end - prop_start, notes)


def as_schedule(schedule: Any) -> list[ManualPartition]:
    """The tactics of a schedule given as an iterable of them or as a single tactic."""
    if isinstance(schedule, ManualPartition):
        return [schedule]
    if isinstance(schedule, Iterable) and not isinstance(schedule, str | bytes | Mapping):
        return list(schedule)
    raise InvalidTacticError(f"a schedule is a partir.ManualPartition or a list of them, "
                             f"got {type(schedule).__name__} {schedule!r}")


def apply_schedule(traced: TracedProgram, mesh: Mesh,
                   schedule: Sequence[ManualPartition]) -> tuple[CoreProgram, list[TacticRecord]]:
    """The traced program as Core, and the record of each tactic applied in order."""
    module = CoreModule(traced, mesh)
    initial = module.snapshot()
    names = named_values(module, traced)
    return initial, [apply_tactic(module, t, names) for t in schedule]
