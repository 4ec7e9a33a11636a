"""Lowering a Core program through the stack: Core -> SPMD -> HLO (optimized, with each
collective attributed to a model line)."""

from __future__ import annotations

from dataclasses import dataclass

from partir.cancel import checkpoint
from partir.core.materialize import materialize
from partir.core.program import CoreProgram
from partir.gcpause import paused_gc
from partir.hlo import count_collectives, locate_by_users, lower_spmd_to_hlo, optimize
from partir.hlo.printing import print_hlo
from partir.ir import Function, print_function
from partir.spmd import lower_core_to_spmd


@dataclass(frozen=True)
class Lowered:
    core: Function
    spmd: Function
    hlo: Function

    @property
    def collectives(self) -> dict[str, int]:
        return count_collectives(self.hlo)

    def text(self, level: str) -> str:
        if level == "hlo":
            return print_hlo(self.hlo)
        return print_function({"core": self.core, "spmd": self.spmd}[level])


def lower(program: CoreProgram) -> Lowered:
    """Cancellable (`partir.cancel`): checked between the stages and inside them."""
    with paused_gc():
        checkpoint()
        core = materialize(program)
        checkpoint()
        spmd = lower_core_to_spmd(core, program.mesh)
        checkpoint()
        hlo = lower_spmd_to_hlo(spmd, defer_gathers=True)
        checkpoint()
        optimized = optimize(hlo)
        checkpoint()
        return Lowered(core, spmd, locate_by_users(optimized))
