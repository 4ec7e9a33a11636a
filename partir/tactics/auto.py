"""AutomaticPartition: a tactic that searches for the tile actions to issue along its
mesh axes (`partir.tactics.search`), guided by the simulator's step time and memory.

It composes with manual tactics: it starts from the state the earlier tactics left (their
decisions are fixed) and later tactics see its decisions. What it issues is what a
ManualPartition would — `tile<%x,d,"axis">` actions on inputs and tagged values, then
`propagate` — so its record, metadata and every tool downstream treat it alike; its
metadata's `search` adds the decisions and the search's statistics, and
`manual_tactics(search)` turns them into ManualPartitions to keep in a schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from partir.errors import InvalidTacticError
from partir.ir import Location, Value
from partir.tactics.base import Tactic, TacticResult
from partir.tactics.forms import UNKNOWN
from partir.tactics.manual import ManualPartition, caller_location
from partir.tactics.search import OBJECTIVES, manual_source, name_pattern, replay, search

if TYPE_CHECKING:
    from partir.core.module import CoreModule


@dataclass
class AutomaticPartition(Tactic):
    """Search which inputs and tagged values to tile along `axes` (or `axis`).

    `budget_s` bounds the search's time (it returns the best found so far);
    `max_evaluations` bounds its simulator evaluations (deterministic, unlike a time
    budget); `seed` orders the candidates; `objective` is "step_time" (memory capacity of
    `device` a hard constraint) or "memory"; `inputs` restricts the search to the inputs
    and tags under these names (default: all); `beam_width` is how many of the best
    states each pass continues from (1: a greedy descent with pair and compound moves)
    and `max_decisions` bounds a strategy's decisions (`partir.tactics.search`)."""

    axes: Sequence[str] | None = None
    axis: str | None = None
    budget_s: float = 60.0
    seed: int = 0
    objective: str = "step_time"
    name: str | None = None
    device: str | None = None
    inputs: Sequence[str] | None = None
    beam_width: int = 1
    max_decisions: int = 64
    max_evaluations: int | None = None
    loc: Location = field(default_factory=caller_location, compare=False)

    def __post_init__(self) -> None:
        if (self.axes is None) == (self.axis is None):
            raise InvalidTacticError("AutomaticPartition takes one of axes=[...] or axis=...",
                                     tactic=self.label, loc=self.loc)
        axes = [self.axis] if self.axis is not None else self.axes
        if isinstance(axes, str) or not all(isinstance(a, str) for a in axes) or not axes:
            raise InvalidTacticError(f"AutomaticPartition axes must be mesh axis names, got "
                                     f"{self.axes!r}", tactic=self.label, loc=self.loc)
        if self.objective not in OBJECTIVES:
            raise InvalidTacticError(f"objective must be one of {', '.join(OBJECTIVES)}, got "
                                     f"{self.objective!r}", tactic=self.label, loc=self.loc)
        if not self.budget_s > 0:
            raise InvalidTacticError(f"budget_s must be positive, got {self.budget_s!r}",
                                     tactic=self.label, loc=self.loc)
        if self.beam_width < 1 or self.max_decisions < 1:
            raise InvalidTacticError("beam_width and max_decisions must be at least 1",
                                     tactic=self.label, loc=self.loc)
        if isinstance(self.inputs, str):
            self.inputs = [self.inputs]

    @property
    def axis_names(self) -> tuple[str, ...]:
        return (self.axis,) if self.axis is not None else tuple(self.axes or ())

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        axes = self.axis_names
        return f"AutomaticPartition({axes[0]!r})" if len(axes) == 1 else \
            f"AutomaticPartition({list(axes)!r})"

    @property
    def axis_label(self) -> str:
        return ",".join(self.axis_names)

    def key_items(self) -> list[tuple[str, Any]]:
        return [("axes", list(self.axis_names)), ("budget_s", self.budget_s),
                ("seed", self.seed), ("objective", self.objective), ("device", self.device),
                ("inputs", None if self.inputs is None else list(self.inputs)),
                ("beam_width", self.beam_width), ("max_decisions", self.max_decisions),
                ("max_evaluations", self.max_evaluations)]

    def run(self, module: CoreModule, names: Mapping[str, list[Value]]) -> TacticResult:
        for a in self.axis_names:
            module.mesh.check_axis(a, tactic=self.label, loc=self.loc)
        # The outputs' layout is the caller's to ask (`out_shardings`, a ManualPartition
        # naming them): a search that tiled them would change what the function returns.
        outputs = set(module.result_names)
        for p in self.inputs or ():
            selected = [n for n in names if n == p or n.startswith(p + "/")]
            if not selected:
                from partir.errors import UnknownInputError
                from partir.tactics.manual import _unknown_message
                raise UnknownInputError(_unknown_message(p, names), tactic=self.label,
                                        loc=self.loc)
            if outputs.issuperset(selected):
                raise InvalidTacticError(
                    f"AutomaticPartition inputs: {p!r} selects outputs only, which the "
                    f"search does not lay out (tile them with a ManualPartition, or ask "
                    f"partir.jit for out_shardings)", tactic=self.label, loc=self.loc)
        names = {n: v for n, v in names.items() if n not in outputs}
        found = search(module, names, self)
        actions, prop_s = replay(module, names, found, self)
        return TacticResult(actions, found.notes, prop_s, found.record)


def manual_tactics(search: Mapping[str, Any], name: str = "Auto") -> list[ManualPartition]:
    """The ManualPartitions that issue what an AutomaticPartition found (its metadata's
    `search`), in order: applied in its place, they give the same program."""
    steps = search.get("manual", [])
    return [ManualPartition(dict(s["inputs"]), axis=s["axis"],
                            name=name if len(steps) == 1 else f"{name}.{k}")
            for k, s in enumerate(steps, 1)]


def pattern_tactics(search: Mapping[str, Any], mesh: Mapping[str, int],
                    name: str = "Auto") -> list[ManualPartition]:
    """What an AutomaticPartition found (its metadata's `search`), as ManualPartitions
    that apply to every input whose name matches a decision's pattern (numeric path
    components as `*`): the same strategy for another size of the same model (other
    layer counts, widths or batch). One ManualPartition per decision, in the search's
    order (each was applied then propagated); a value whose dimension the axis (of
    `mesh`) does not divide is left to propagation."""
    out = []
    decisions = search.get("decisions", [])
    for k, d in enumerate(decisions, 1):
        pattern, dim, axis = d["inputs"], d["dim"], d["axis"]
        size = mesh[axis]

        def rule(n: str, shape: tuple[int, ...], pattern: str = pattern, dim: int = dim,
                 size: int = size) -> int | object:
            if name_pattern(n) == pattern and len(shape) > dim and shape[dim] % size == 0:
                return dim
            return UNKNOWN

        out.append(ManualPartition({pattern.split("/", 1)[0]: rule}, axis=axis,
                                   name=name if len(decisions) == 1 else f"{name}.{k}"))
    return out


__all__ = ["AutomaticPartition", "manual_source", "manual_tactics", "pattern_tactics"]
