"""SSA values."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from partir.ir.types import Type

_ids = itertools.count()


@dataclass(eq=False)
class Value:
    """An SSA value. `name` is a hint for printing (argument names, tags)."""

    type: Type
    name: str | None = None
    id: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"Value(%{self.name or self.id}: {self.type})"
