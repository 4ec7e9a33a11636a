"""Loop actions: what a `loop` over a mesh axis does with each iteration's result.

`#tile<d>` concatenates the iterations' results along dimension d, `#sum` reduces them
with an associative monoid, and `any` asserts they are all equal (the value stays
replicated on that axis).
"""

from __future__ import annotations

from dataclasses import dataclass

from partir.ir.monoids import NAMES as MONOIDS


@dataclass(frozen=True)
class Tile:
    dim: int

    def __str__(self) -> str:
        return f"#tile<{self.dim}>"


@dataclass(frozen=True)
class Sum:
    monoid: str = "add"

    def __post_init__(self) -> None:
        if self.monoid not in MONOIDS:
            raise ValueError(f"#sum monoid must be one of {MONOIDS}, got {self.monoid!r}")

    def __str__(self) -> str:
        return "#sum" if self.monoid == "add" else f"#sum<{self.monoid}>"


@dataclass(frozen=True)
class AnyAction:
    """Every device computes the whole value. A `barrier` (the BARRIER form's loop) keeps
    its value whole without keeping the ops that read it whole: they may take slices.
    Propagation on the axis crosses the value in neither direction, and goes on past it
    from the readers' other operands."""

    barrier: bool = False

    def __str__(self) -> str:
        return "barrier" if self.barrier else "any"


ANY = AnyAction()
Action = Tile | Sum | AnyAction


@dataclass(frozen=True)
class Loop:
    """One loop of an op's nest: the mesh axis, the action on each result, and the
    dimension along which each operand is sliced by the loop index (None: used whole)."""

    axis: str
    results: tuple[Action, ...]
    operands: tuple[int | None, ...]
