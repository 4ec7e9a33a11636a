"""ShardingConstraints: the model's own sharding annotations as a tactic.

A model written for GSPMD says how its values are sharded with
`jax.lax.with_sharding_constraint` (flax's `nn.with_logical_constraint` binds it once its
logical axis rules, those in effect when the model is traced, name mesh axes). The
frontend records each annotation (`partir.frontend.annotation`); this tactic turns them
into value actions in program order, then propagates, so the model partitions as its
authors meant and later tactics compose after it. Without it, a schedule ignores them,
and the program's notes say so once per annotated line (`annotation_notes`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from partir.errors import AxisNotInMeshError, InvalidTacticError
from partir.frontend import Annotation, TracedProgram
from partir.ir import Location, Value
from partir.tactics.base import Tactic, TacticResult
from partir.tactics.manual import (
    ActionSpec,
    caller_location,
    issue_rounds,
    spec_axes,
    spec_tiles,
)

if TYPE_CHECKING:
    from partir.core.module import CoreModule


@dataclass
class ShardingConstraints(Tactic):
    """Apply the model's sharding annotations, in program order, as GSPMD's exact
    constraints: a dimension whose spec names axes is tiled on them (several axes major
    first), and the axes of the annotation's mesh that its spec uses nowhere keep the
    value replicated (`atomic`). A `P.UNCONSTRAINED` dimension is left to propagation,
    and so are the other axes where a spec has one (that dimension may take them).

    The annotation speaks for its own mesh: each of its axes is the schedule's mesh axis
    of the same name (the sizes are the schedule's), a spec naming an axis the schedule's
    mesh lacks is an AxisNotInMeshError, and axes of the schedule's mesh that the
    annotation's mesh does not have are left to propagation and to later tactics. So a
    model annotated for data parallelism composes with a later ManualPartition on a
    `model` axis, while one annotated on a mesh with that axis keeps the annotated values
    replicated on it, as `jax.jit` would. Inside a loop's bodies a value can only be
    tiled (the loop op is sliced), so there the unused axes are not made atomic.

    There are no parameters besides `name`: the annotations are part of the traced
    program, which the session's cache keys already hold."""

    name: str | None = None
    loc: Location = field(default_factory=caller_location, compare=False)

    @property
    def label(self) -> str:
        return self.name or "ShardingConstraints"

    @property
    def axis_label(self) -> str:
        return "annotations"

    def key_items(self) -> list[tuple[str, Any]]:
        return []

    def run(self, module: CoreModule, names: Mapping[str, list[Value]]) -> TacticResult:
        ranked = [(k, action) for ann in module.traced.annotations
                  for k, action in self.actions(module, ann, ann.value)]
        actions, prop_s = issue_rounds(module, ranked, self.label, self.loc, pad=True)
        return TacticResult(actions, [], prop_s)

    def actions(self, module: CoreModule, ann: Annotation, value: Value
                ) -> list[tuple[int, ActionSpec]]:
        """What one annotation asks of its value, on the schedule's mesh, each action
        with its round (`issue_rounds`)."""
        if ann.spec is None:
            raise InvalidTacticError(f"{ann.label}: its sharding names no mesh axes (only a "
                                     f"NamedSharding or a PartitionSpec does)",
                                     tactic=self.label, loc=ann.loc)
        axes = spec_axes(ann.spec, value.type.shape, ann.label, self.label, ann.loc)
        mesh = module.mesh.user_mesh
        used = [a for dim_axes in axes if dim_axes for a in dim_axes]
        for a in used:
            if a not in mesh:
                raise AxisNotInMeshError(
                    f"{ann.label} names mesh axis {a!r}, which the schedule's mesh {mesh} "
                    f"does not have (its axes: {', '.join(map(repr, mesh))})",
                    tactic=self.label, loc=ann.loc)
        name = f"{os.path.basename(ann.loc.file)}:{ann.loc.line}"
        out = spec_tiles(name, value, axes)
        if None not in axes:
            out += [(0, ActionSpec("atomic", name, value, a)) for a in ann.mesh_axes
                    if a in mesh and a not in used]
        return out


def annotation_notes(traced: TracedProgram, schedule: Sequence[Tactic]) -> list[str]:
    """The model's sharding annotations a schedule ignores (it has no
    ShardingConstraints): one note per source line holding some."""
    if any(isinstance(t, ShardingConstraints) for t in schedule):
        return []
    lines: dict[Location, list[Annotation]] = {}
    for ann in traced.annotations:  # a line's forward and backward annotations together
        lines.setdefault(ann.loc, []).append(ann)
    return [f"{anns[0].label} ignored{f' ({len(anns)} values)' if len(anns) > 1 else ''}: "
            f"the schedule decides shardings; partir.ShardingConstraints() applies the "
            f"model's annotations" for anns in lines.values()]


__all__ = ["ShardingConstraints", "annotation_notes"]
