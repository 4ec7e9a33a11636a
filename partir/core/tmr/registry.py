"""The tile-mapping registry (TMR): the loops an op can be rewritten into, derived from
its primitive's factor rule (`partir.rules`).

Each `TileMapping` gives the dimension along which every operand is sliced (None: used
whole) and the action on every result (`Tile(d)` or `Sum(monoid)`): one per factor that
may be sliced, i.e. not a need-replication factor and, at the current factor sizes, the
major factor of every dimension it is part of. A single propagation algorithm uses these
mappings for all ops. Where the local op is not the same primitive on smaller operands,
its declaration's `apply` computes it from the tile's offsets (e.g. `iota` adds the tile
offset); the materializer turns that computation into explicit ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from partir.core.actions import Action, Sum, Tile
from partir.registry import Registry
from partir.rules import CATALOGUE, REPLICATION, OpView, Primitive, ShardingRule
from partir.rules.catalogue import ApplyFn


@dataclass(frozen=True)
class TileMapping:
    operands: tuple[int | None, ...]
    results: tuple[Action, ...]
    # Per operand, the dim the mapping's factor is made of although the loop reads the
    # operand whole (`Factor.whole`), else None; () where there is none. A tile of the
    # operand on that dim supports the mapping: the loop gathers it.
    whole: tuple[int | None, ...] = ()

    def __str__(self) -> str:
        ops = ", ".join("⊥" if d is None else f"#tile<{d}>" for d in self.operands)
        return f"({ops}) -> {', '.join(map(str, self.results))}"

    def gathers(self, i: int, d: int) -> bool:
        """Does a loop of this mapping read operand i whole where its factor is dim d?"""
        return bool(self.whole) and self.whole[i] == d


def factor_mappings(rule: ShardingRule, sizes: Sequence[int]
                    ) -> list[tuple[int, TileMapping]]:
    """(factor, mapping) for every factor that may be sliced at the given factor sizes,
    in the rule's factor order."""
    out = []
    majors = rule.majors(sizes)
    for f, factor in enumerate(rule.factors):
        if factor.kind == REPLICATION or f not in majors:
            continue
        results: list[Action] = []
        for d in rule.result_dims[f]:
            if d is not None:
                results.append(Tile(d))
            elif factor.monoid is not None:
                results.append(Sum(factor.monoid))
            else:
                break  # in some results but not others: no single action
        if len(results) == len(rule.results):
            whole = dict(factor.whole)
            out.append((f, TileMapping(rule.operand_dims[f], tuple(results), tuple(
                [whole.get(i) for i in range(len(rule.operands))] if whole else ()))))
    return out


@dataclass(frozen=True)
class Entry:
    primitive: Primitive

    @property
    def localize(self):
        return self.primitive.localize

    @property
    def apply(self) -> ApplyFn | None:
        return self.primitive.apply

    def rule(self, view: OpView) -> ShardingRule:
        return self.primitive.rule(view)

    def mappings(self, view: OpView) -> list[TileMapping]:
        """The mappings of an op whose (local) types the view gives."""
        rule = self.rule(view)
        return [m for _, m in factor_mappings(rule, rule.sizes)]


REGISTRY: Registry[Entry] = Registry("TMR entry")
for _name, _primitive in CATALOGUE.items():
    if _primitive.rule is not None:
        REGISTRY.register(_name, Entry(_primitive))


def lookup(name: str) -> Entry | None:
    return REGISTRY.get(name)


def localized(entry: Entry, view: OpView) -> dict[str, Any]:
    """The local op's parameters."""
    return dict(view.params) if entry.localize is None else entry.localize(view)
