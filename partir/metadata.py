"""What partitioning reports: per tactic and for the final program. Plain data, JSON-able
(`to_json`), except `in_specs`/`out_specs`, which are pytrees of `PartitionSpec` like
`jax.jit`'s shardings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import jax
from jax.sharding import PartitionSpec

from partir.sim import Cost


@dataclass
class TacticMetadata:
    name: str
    axis: str
    actions: list[str]
    collectives: dict[str, int]
    shardings: dict[str, list[list[str]]]  # input/output name -> per-dim mesh axes
    conflicts: list[dict[str, Any]]
    notes: list[str]
    core_ir: str
    elapsed_s: float
    cost: Cost | None = None  # the simulator's estimate for the program after this tactic


@dataclass
class Metadata:
    tactics: list[TacticMetadata] = field(default_factory=list)
    in_specs: tuple = ()
    out_specs: tuple = ()
    core_ir: str = ""
    spmd_ir: str = ""
    hlo_ir: str = ""
    stablehlo: str | None = None  # text of the executable module, once it is lowered
    collectives: dict[str, int] = field(default_factory=dict)
    cost: Cost | None = None  # the simulator's estimate for the final program

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["in_specs"] = _specs_to_json(self.in_specs)
        out["out_specs"] = _specs_to_json(self.out_specs)
        return out


def _specs_to_json(specs: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda s: [list(a) if isinstance(a, tuple) else a for a in s], specs,
        is_leaf=lambda s: isinstance(s, PartitionSpec))
