"""Lowering a Core program through the stack: Core -> SPMD -> HLO (optimized, with each
collective attributed to a model line)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from partir.cancel import checkpoint
from partir.core.materialize import materialize
from partir.core.program import CoreProgram
from partir.core.regions import set_region_lowering
from partir.gcpause import paused_gc
from partir.hlo import count_collectives, locate_by_users, lower_spmd_to_hlo, optimize
from partir.hlo.ops import COLLECTIVES, collectives_by_axes
from partir.hlo.printing import print_hlo
from partir.ir import Function, Region, print_function
from partir.ir.fragments import Fragments
from partir.rules.catalogue import region_ops
from partir.rules.collectives import named_axes
from partir.spmd import lower_core_to_spmd


@dataclass(frozen=True)
class Lowered:
    core: Function
    spmd: Function
    hlo: Function

    @property
    def collectives(self) -> dict[str, int]:
        return count_collectives(self.hlo)

    @property
    def executed_collectives(self) -> dict[str, int]:
        return count_collectives(self.hlo, executed=True)

    def executed_by_axes(self) -> dict[tuple[str, tuple[str, ...]], int]:
        return collectives_by_axes(self.hlo, executed=True)

    def collective_sites(self, executed: bool = False) -> Counter:
        """The HLO program's collectives by (kind, axes, the value they move, model file,
        line, function): the value is followed back through chains of collectives to an
        argument or a named value; a collective inside a loop's body is at the line of
        the body equation it serves, moving no named value, and with `executed` counts
        as many times as its loops run it per call."""
        fn = self.hlo
        producer = {r: op for op in fn.ops for r in op.results}
        counts: Counter = Counter()
        for op in fn.ops:
            # The test keeps a generator off every op without regions (all but a few).
            for inner, times in region_ops(op) if op.regions else ():
                if inner.name in COLLECTIVES:
                    loc = inner.loc if inner.loc.line else op.loc
                    counts[(inner.name.removeprefix("hlo."), named_axes(inner), None,
                            loc.file, loc.line, loc.function)] += (times or 1) if executed else 1
            if op.name not in COLLECTIVES:
                continue
            v = op.operands[0] if op.operands else None
            while v is not None and v in producer and producer[v].name in COLLECTIVES:
                v = producer[v].operands[0]
            name = v.name if v is not None else None
            counts[(op.name.removeprefix("hlo."), named_axes(op), name, op.loc.file,
                    op.loc.line, op.loc.function)] += 1
        return counts

    def text(self, level: str) -> str:
        if level == "hlo":
            return print_hlo(self.hlo)
        return print_function({"core": self.core, "spmd": self.spmd}[level])


def lower(program: CoreProgram, fragments: Fragments | None = None) -> Lowered:
    """Cancellable (`partir.cancel`): checked between the stages and inside them.
    `fragments`: what materializing and the SPMD lowering made for programs lowered
    before, reused where this one has the same ops (`partir.ir.fragments`); the result is
    the same either way. (The HLO lowering costs per op what looking a fragment up
    would, and the fusion passes and the simulator see the whole program.)"""
    with paused_gc():
        checkpoint()
        core = materialize(program, fragments=fragments)
        checkpoint()
        spmd = lower_core_to_spmd(core, program.mesh, fragments)
        checkpoint()
        hlo = lower_spmd_to_hlo(spmd, defer_gathers=True)
        checkpoint()
        optimized = optimize(hlo)
        checkpoint()
        return Lowered(core, spmd, locate_by_users(optimized))


def _lower_region(program: CoreProgram) -> Region:
    """A region of a control-flow op, lowered as a program of its own: the device-local
    region its op's localization takes (`partir.core.regions`)."""
    fn = lower(program).hlo
    return Region(list(fn.args), list(fn.ops), list(fn.results))


set_region_lowering(_lower_region)
