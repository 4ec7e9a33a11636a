"""The tile-mapping registry (TMR): one declarative entry per primitive.

An entry says, for an op with given (local) operand and result types and parameters,
which loops the op can be rewritten into: each `TileMapping` gives the dimension along
which every operand is sliced (None: used whole) and the action on every result
(`Tile(d)` or `Sum(monoid)`). A single propagation algorithm uses these entries for all
ops. An entry also knows how to rewrite the op's parameters for a local tile
(`localize`) and, where the local op is not the same primitive on smaller operands, how
to compute it from the loop indices (`apply`, e.g. `iota` adds the tile offset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from partir.core.actions import Action
from partir.ir.types import TensorType
from partir.registry import Registry


@dataclass(frozen=True)
class TileMapping:
    operands: tuple[int | None, ...]
    results: tuple[Action, ...]

    def __str__(self) -> str:
        ops = ", ".join("⊥" if d is None else f"#tile<{d}>" for d in self.operands)
        return f"({ops}) -> {', '.join(map(str, self.results))}"


@dataclass(frozen=True)
class OpView:
    """What an entry sees of an op: its name, parameters and operand/result types.

    In `mappings` and `localize` the types are the op's local types inside its current
    loop nest while `params` are still the original (global) ones, so entries read sizes
    from the types, never from shape parameters. In `apply` the params are localized.
    """

    name: str
    params: Mapping[str, Any]
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]

    @property
    def in_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.in_types)

    @property
    def out_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.out_types)


MappingsFn = Callable[[OpView], Iterable[TileMapping]]
LocalizeFn = Callable[[OpView], dict[str, Any]]
# apply(op, prim, operands, ctx) -> results; `op` is the local view with localized params.
ApplyFn = Callable[[OpView, Any, Sequence[Any], Any], list[Any]]


@dataclass(frozen=True)
class Entry:
    mappings: MappingsFn
    localize: LocalizeFn | None = None
    apply: ApplyFn | None = None
    doc: str = field(default="", compare=False)


REGISTRY: Registry[Entry] = Registry("TMR entry")


def register(names: str | Iterable[str], entry: Entry) -> Entry:
    return REGISTRY.register(names, entry)


def lookup(name: str) -> Entry | None:
    return REGISTRY.get(name)


def localized_params(entry: Entry, view: OpView) -> dict[str, Any]:
    return dict(view.params) if entry.localize is None else entry.localize(view)
