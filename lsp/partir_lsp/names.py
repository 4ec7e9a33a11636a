"""The names a tactic's inputs dict can use, from a partition result's values: the
program's inputs, outputs (`out/1/w`) and tags, and every pytree path prefix of them, as
`ManualPartition` matches a key (`params/layers` selects each value named
`params/layers/...`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from partir_daemon import protocol as P

SELECTABLE = ("input", "output", "tag")


@dataclass(frozen=True)
class Names:
    values: tuple[P.ExplainedValue, ...]

    @classmethod
    def of(cls, values: Sequence[P.ExplainedValue]) -> Names:
        return cls(tuple(v for v in values if v.kind in SELECTABLE))

    def under(self, key: str) -> list[P.ExplainedValue]:
        """The values the key selects: the one named `key` and those below it."""
        return [v for v in self.values if v.name == key or v.name.startswith(key + "/")]

    def paths(self) -> list[str]:
        """Every name and prefix a key can be, in the order of the values."""
        out: dict[str, None] = {}
        for v in self.values:
            parts = v.name.split("/")
            for i in range(1, len(parts) + 1):
                out.setdefault("/".join(parts[:i]))
        return list(out)

    def children(self, typed: str) -> list[str]:
        """The paths one segment below the part of `typed` up to its last "/" (the top
        level when it has none), in the order of the values: what to offer next."""
        directory = typed[:typed.rfind("/") + 1]
        out: dict[str, None] = {}
        for v in self.values:
            if v.name.startswith(directory):
                segment = v.name[len(directory):].split("/", 1)[0]
                out.setdefault(directory + segment)
        return list(out)
