"""Functions: named arguments, a body, named results."""

from __future__ import annotations

from dataclasses import dataclass, field

from partir.ir.ops import Op
from partir.ir.values import Value


@dataclass(eq=False)
class Function:
    name: str
    args: list[Value]
    ops: list[Op]
    results: list[Value]
    result_names: list[str] = field(default_factory=list)
    attributes: dict[str, object] = field(default_factory=dict)

    @property
    def arg_names(self) -> list[str]:
        return [a.name or f"arg{i}" for i, a in enumerate(self.args)]
