"""Conflicts: places where propagation stopped, recorded as data for users and tools."""

from __future__ import annotations

from dataclasses import dataclass, fields

from partir.ir import Location

# Several TMR mappings match (or operands disagree), so no choice is made.
MULTIPLE_MATCHES = "multiple_matches"
# The op is already inside a loop over the axis: a nested loop over it is invalid.
AXIS_IN_SCOPE = "axis_in_scope"
# The only matching mappings need a dimension the axis size does not divide.
INDIVISIBLE = "indivisible"
# The only matching mappings would slice an operand the user keeps replicated (atomic).
REPLICATED_OPERAND = "replicated_operand"
# The primitive has no TMR entry: propagation is blocked at it.
UNSUPPORTED = "unsupported"
# The op's rule cannot slice the requested dimension: it needs replication (a sorted,
# scanned or reversed dim...), or the axis would fall on the minor factor of a dimension
# the op splits or merges, which needs a sub-axis.
NEEDS_REPLICATION = "needs_replication"
# A needs_replication of a slice that, with the other slices of its operand a
# concatenation puts back in another order, rolls or shifts the sliced dimension
# (`jnp.roll`, a pipeline's activations moving one stage on): the lowering moves the
# pieces between neighbouring devices (`permute_shifted_tiles`) rather than gathering.
SHIFTED_TILES = "shifted_tiles"


@dataclass(frozen=True)
class Conflict:
    kind: str
    op: str
    loc: Location
    axis: str
    choices: tuple[str, ...]
    detail: str = ""

    def __str__(self) -> str:
        text = f"{self.kind} at {self.op} ({self.loc}) on axis {self.axis!r}"
        if self.choices:
            text += ": " + " vs ".join(self.choices)
        if self.detail:
            text += f" [{self.detail}]"
        return text

    def to_json(self) -> dict:
        # The fields in order, read directly: `asdict` deep-copies field by field, and a
        # model's tactics report hundreds of conflicts with every partition.
        fields_ = {f.name: getattr(self, f.name) for f in fields(self)}
        return fields_ | {"loc": {"file": self.loc.file, "line": self.loc.line},
                          "choices": list(self.choices)}
