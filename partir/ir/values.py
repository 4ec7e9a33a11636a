"""SSA values."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from partir.ir.types import Type

_ids = itertools.count()


# Slotted: every stage of the pipeline builds its program anew, so values are made,
# read and dropped by the hundred thousand, which slots make faster than a __dict__.
@dataclass(eq=False, slots=True)
class Value:
    """An SSA value. `name` is a hint for printing (argument names, tags)."""

    type: Type
    name: str | None = None
    # The counter's own __next__, not a lambda around it: one Python call fewer for each
    # of the many values the compiler passes create.
    id: int = field(default_factory=_ids.__next__)

    def __repr__(self) -> str:
        return f"Value(%{self.name or self.id}: {self.type})"
