"""What the schedule driver asks of a tactic (`Tactic`), and what a tactic gives back
(`TacticResult`). ManualPartition and AutomaticPartition are tactics: both rewrite the
Core module with value actions (tile, atomic) followed by propagation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from partir.core.module import CoreModule
    from partir.ir import Location, Value


@dataclass
class TacticResult:
    """What applying a tactic did: the actions it issued, in order (`tile<...>`,
    `atomic<...>`, `propagate`), notes on what it left alone, the time its propagations
    took, and for a search, its record (`search`, JSON-able)."""

    actions: list[str]
    notes: list[str] = field(default_factory=list)
    propagation_s: float = 0.0
    search: dict[str, Any] | None = None
    # A pipeline tactic's schedule (`PipelinePartition.run`), JSON-able.
    pipeline: dict[str, Any] | None = None


class Tactic(ABC):
    """A step of a schedule. Subclasses are dataclasses with `name` and `loc` fields."""

    name: str | None
    loc: Location

    @property
    @abstractmethod
    def label(self) -> str:
        """The tactic's name in reports and errors."""

    @property
    @abstractmethod
    def axis_label(self) -> str:
        """The mesh axis (or axes, comma-separated) the tactic acts on."""

    @abstractmethod
    def run(self, module: CoreModule, names: Mapping[str, list[Value]]) -> TacticResult:
        """Rewrite `module` in place: issue actions, then propagate."""

    @abstractmethod
    def key_items(self) -> Iterable[tuple[str, Any]]:
        """What identifies the tactic's effect besides its type, name and axis (the
        session's cache keys hash it); not its source location."""
