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
from partir.errors import InvalidTacticError
from partir.frontend import TracedProgram
from partir.gcpause import paused_gc
from partir.ir import Value
from partir.mesh import Mesh
from partir.tactics.base import Tactic
from partir.tactics.manual import expand  # noqa: F401  (re-exported)


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
    search: dict[str, Any] | None = None  # an automatic tactic's search record
    pipeline: dict[str, Any] | None = None  # a pipeline tactic's schedule

    def core_ir(self) -> str:
        from partir.core.printing import print_core
        return print_core(self.program)


def named_values(module: CoreModule, traced: TracedProgram
                 ) -> dict[str, list[Value]]:
    """What tactics may name: inputs, outputs (the values returned, under the output root
    of `partir.frontend.names`) and tags, those inside control-flow ops' regions too."""
    names: dict[str, list[Value]] = {
        n: [v] for n, v in zip(traced.input_names, module.args, strict=True)}
    names.update((n, [v]) for n, v in zip(traced.output_names, module.results, strict=True))
    for tag, values in module.tags.items():
        names.setdefault(tag, []).extend(values)
    return names


def apply_tactic(module: CoreModule, tactic: Tactic,
                 names: dict[str, list[Value]]) -> TacticRecord:
    if not isinstance(tactic, Tactic):
        raise InvalidTacticError(f"a schedule holds tactics such as partir.ManualPartition "
                                 f"or partir.AutomaticPartition, got {type(tactic).__name__}")
    with paused_gc():
        return _apply_tactic(module, tactic, names)


def _apply_tactic(module: CoreModule, tactic: Tactic,
                  names: dict[str, list[Value]]) -> TacticRecord:
    start = time.perf_counter()
    splits, noted = len(module.splits), len(module.notes)
    before = set(module.conflicts)
    result = tactic.run(module, names)
    end = time.perf_counter()
    conflicts = [c for key, c in module.conflicts.items() if key not in before]
    notes = result.notes + module.splits[splits:] + module.notes[noted:]
    return TacticRecord(tactic.label, tactic.axis_label, result.actions, conflicts,
                        module.snapshot(), end - start, result.propagation_s, notes,
                        result.search, result.pipeline)


def as_schedule(schedule: Any) -> list[Tactic]:
    """The tactics of a schedule given as an iterable of them or as a single tactic."""
    if isinstance(schedule, Tactic):
        return [schedule]
    if isinstance(schedule, Iterable) and not isinstance(schedule, str | bytes | Mapping):
        return list(schedule)
    raise InvalidTacticError(f"a schedule is a partir.ManualPartition or a list of them, "
                             f"got {type(schedule).__name__} {schedule!r} (tactics: "
                             f"partir.ManualPartition, partir.AutomaticPartition)")


def apply_schedule(traced: TracedProgram, mesh: Mesh,
                   schedule: Sequence[Tactic]) -> tuple[CoreProgram, list[TacticRecord]]:
    """The traced program as Core, and the record of each tactic applied in order. The
    program is the one the schedule's rewrites make (`pipelined`): the caller passes it
    rewritten."""
    module = CoreModule(traced, mesh)
    initial = module.snapshot()
    names = named_values(module, traced)
    return initial, [apply_tactic(module, t, names) for t in schedule]
