"""Operations and regions.

An `Op` is a named operation with operands, results, static parameters, optional regions
and a source location. Primitive ops carry the JAX primitive they replay; Core and later
dialects add their own op names (`loop`, `slice`, `yield`, `tag`, collectives...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from partir.ir.location import UNKNOWN_LOCATION, Location
from partir.ir.values import Value


# Slotted, as `Value` is: every stage of the pipeline builds its program anew.
@dataclass(eq=False, slots=True)
class Region:
    """A single-block region: block arguments, ops, and the values it yields."""

    args: list[Value]
    ops: list[Op] = field(default_factory=list)
    yields: list[Value] = field(default_factory=list)


@dataclass(eq=False, slots=True)  # as Region
class Op:
    name: str
    operands: list[Value]
    results: list[Value]
    params: dict[str, Any] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    loc: Location = UNKNOWN_LOCATION
    prim: Any = None  # the jax Primitive for primitive ops

    def __repr__(self) -> str:
        return f"Op({self.name} @ {self.loc})"
