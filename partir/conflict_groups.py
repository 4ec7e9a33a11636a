"""Conflicts as users read them: grouped by kind, op and model line (a model's layers
repeat one conflict on one line, so a transformer's tactic reports dozens of conflicts
that are a handful of places), each group said in plain language.

The editor's warnings (`partir_lsp.render`) and `partir partition`'s report are both made
from these groups, so a user sees the same conflicts in either. They read conflicts as
JSON (`Conflict.to_json`: what the daemon sends, and what the command line has at hand).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# What each kind of conflict (`partir.core.conflicts`) means, in the user's terms. By
# their names, not imported: `partir.core` loads JAX, which the language server, reading
# the daemon's results, does without (tests/test_conflict_groups.py checks the names).
MEANING = {
    "axis_in_scope": "the op is already inside a loop over this axis",
    "multiple_matches": "several shardings of the op fit and none was chosen",
    "indivisible": "the axis size does not divide the dimensions the op would be sharded on",
    "replicated_operand": "sharding the op would slice an operand kept replicated",
    "unsupported": "partir has no propagation rule for this primitive",
    "needs_replication": "the op cannot be sharded along the dimension propagation brings",
    "shifted_tiles": "the op rolls or shifts the sharded dimension: each device needs its "
                     "neighbours' pieces",
}
# What each kind costs the partitioned program and what users usually do about it: a
# conflict is not an error, and some are what a tactic is for (ZeRO-3's parameters inside
# the batch loop are gathered where they are used).
ADVICE = {
    "axis_in_scope": "Costs an all_gather where the op uses it; expected for ZeRO-3/FSDP "
                     "parameters, else tile on another axis",
    "multiple_matches": "The op stays unsharded here (redundant compute); tile one of its "
                        "operands or results to choose",
    "indivisible": "The op stays unsharded here (redundant compute, no traffic); shard a "
                   "dimension the axis divides",
    "replicated_operand": "The op stays unsharded here (redundant compute); stop "
                          "replicating the operand if it may be sliced",
    "unsupported": "Ops past it stay unsharded (redundant compute, a gather before it); "
                   "tile its result in a tactic",
    "needs_replication": "Costs an all_gather of that dimension before the op; shard "
                         "another dimension instead",
    "shifted_tiles": "Costs a collective_permute of the pieces that move (the lowering "
                     "sends them to the neighbours rather than gathering); expected for "
                     "a pipeline's activations",
}
UNSUPPORTED = "unsupported"


def meaning(kind: str) -> str:
    return MEANING.get(kind, kind)


def advice(kind: str) -> str:
    """Whether a conflict of this kind costs anything, and the usual fix ("" unknown)."""
    return ADVICE.get(kind, "")


@dataclass(frozen=True)
class ConflictGroup:
    """The conflicts of one tactic of one kind at one op of one model line."""

    kind: str
    op: str
    file: str
    line: int
    conflicts: tuple[dict[str, Any], ...]

    @property
    def blocked(self) -> bool:
        """Propagation stopped at a primitive it has no rule for (not a choice)."""
        return self.kind == UNSUPPORTED

    @property
    def axes(self) -> list[str]:
        return list(dict.fromkeys(c.get("axis", "") for c in self.conflicts))

    @property
    def meaning(self) -> str:
        return meaning(self.kind)

    @property
    def site(self) -> str:
        """`model.py:12`, or "" when the op has no model line."""
        return f"{os.path.basename(self.file)}:{self.line}" if self.file and self.line \
            else ""

    @property
    def advice(self) -> str:
        return advice(self.kind)

    def message(self, tactic: str) -> str:
        """The group in one sentence; `tactic` names it ("tactic 2 (MP)")."""
        axes = self.axes
        on = ("axis " if len(axes) == 1 else "axes ") + ", ".join(f"'{a}'" for a in axes)
        if self.blocked:
            text = f"propagation of {tactic} on {on} is blocked at `{self.op}`"
        else:
            text = f"conflict in {tactic} at `{self.op}` on {on}"
        if len(self.conflicts) > 1:
            text += f", {len(self.conflicts)} times"
        text += f": {self.meaning}"
        detail = self.conflicts[0].get("detail")
        if self.blocked and detail:
            text += f" ({detail})"  # why it has none, from the catalogue
        return text

    def occurrences(self) -> list[str]:
        """What each conflict adds to the group's message, without repeats: the choices
        propagation could not decide between, with a detail other than the kind's
        meaning, or the detail alone (why a dimension cannot be sharded). A blocked
        primitive's conflicts add nothing: the message says it all."""
        out = []
        for c in self.conflicts:
            choices, detail = c.get("choices") or [], c.get("detail", "")
            where = f"on axis '{c.get('axis', '')}': "
            if choices:
                text = where + " vs ".join(choices)
                out.append(text + f" ({detail})" if detail and detail != self.meaning
                           else text)
            elif detail and not self.blocked:
                out.append(where + detail)
        return list(dict.fromkeys(out))


def group_conflicts(conflicts: Iterable[dict[str, Any]]) -> list[ConflictGroup]:
    """The conflicts (as JSON) by kind, op and model line, in the order first met."""
    groups: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for c in conflicts:
        loc = c.get("loc") or {}
        key = (c.get("kind", ""), c.get("op", ""), loc.get("file", "") or "",
               loc.get("line", 0) or 0)
        groups.setdefault(key, []).append(c)
    return [ConflictGroup(*key, tuple(items)) for key, items in groups.items()]
