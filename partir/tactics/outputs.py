"""OutShardings: `out_shardings` (of `partir.jit` and `partir.partition`) as one more
tactic, applied after the schedule.

Each constrained output's `PartitionSpec` becomes one tile action per axis it names
(`tile<%out/1,0,"batch">`, in the spec's order), then propagation, as a ManualPartition
naming the output would issue them. The spec is also recorded on the program as the
output's exact sharding (`CoreModule.out_constraints`), which the lowering keeps: an axis
the spec does not name comes back gathered even where propagation left the output
sharded on it, as `jax.jit` returns each output with exactly its out_sharding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import PartitionSpec

from partir.errors import InvalidTacticError, UnknownInputError
from partir.ir import Location, Value
from partir.tactics.base import Tactic, TacticResult
from partir.tactics.manual import (
    ActionSpec,
    caller_location,
    entry_axes,
    is_spec_leaf,
    issue,
)

if TYPE_CHECKING:
    from partir.core.module import CoreModule
    from partir.frontend import TracedProgram

AxesPerDim = tuple[tuple[str, ...], ...]


@dataclass
class OutShardings(Tactic):
    """Lay out the outputs named in `specs` (output name -> PartitionSpec) exactly as
    their specs say. `of` makes it from a pytree prefix of the outputs, as `jax.jit`'s
    `out_shardings`."""

    specs: Mapping[str, PartitionSpec]
    name: str | None = None
    loc: Location = field(default_factory=caller_location, compare=False)

    def __post_init__(self) -> None:
        for name, spec in self.specs.items():
            _check_leaf(repr(name), spec, self.label, self.loc)

    @classmethod
    def of(cls, out_shardings: Any, traced: TracedProgram) -> OutShardings | None:
        """The tactic for `out_shardings`, a pytree prefix of `traced`'s outputs whose
        leaves are PartitionSpecs or None (no constraint on the outputs under it); None
        where it constrains none."""
        names = jax.tree_util.tree_unflatten(traced.out_tree, traced.output_names)
        try:
            full = jax.tree.broadcast(out_shardings, names, is_leaf=is_spec_leaf)
        except ValueError as e:
            raise InvalidTacticError(f"out_shardings must be a pytree prefix of the "
                                     f"function's outputs ({traced.out_tree}): {e}",
                                     tactic="out_shardings") from None
        specs = {n: s for n, s in zip(traced.output_names,
                                      jax.tree.leaves(full, is_leaf=is_spec_leaf),
                                      strict=True) if s is not None}
        return cls(specs) if specs else None

    @property
    def label(self) -> str:
        return self.name or "out_shardings"

    @property
    def axis_label(self) -> str:
        axes = dict.fromkeys(a for spec in self.specs.values()
                             for dim in _axes(spec) for a in dim)
        return ",".join(axes)

    def key_items(self) -> list[tuple[str, Any]]:
        return [(n, tuple(spec)) for n, spec in self.specs.items()]

    def run(self, module: CoreModule, names: Mapping[str, list[Value]]) -> TacticResult:
        position = {n: r for r, n in enumerate(module.result_names)}
        actions: list[ActionSpec] = []
        for name, spec in self.specs.items():
            if name not in position:
                raise UnknownInputError(
                    f"out_shardings names {name!r}, which is no output of the function "
                    f"(outputs: {', '.join(module.result_names) or 'none'})",
                    tactic=self.label, loc=self.loc)
            value = names[name][0]
            dims = self._dims(module, name, spec, value.type.rank)
            for d, axes in enumerate(dims):
                actions += [ActionSpec("tile", name, value, a, d) for a in axes
                            if not _tiled(module, position[name], d, a)]
            module.out_constraints[position[name]] = dims
        issued, prop_s = issue(module, actions, self.label, self.loc)
        return TacticResult(issued, [], prop_s)

    def _dims(self, module: CoreModule, name: str, spec: PartitionSpec,
              rank: int) -> AxesPerDim:
        """The spec's axes per dimension of the output, checked; dimensions past the
        spec's end are unconstrained (replicated), as in JAX."""
        if len(spec) > rank:
            raise InvalidTacticError(f"out_shardings for {name!r}: {spec} has {len(spec)} "
                                     f"entries, but the output has rank {rank}",
                                     tactic=self.label, loc=self.loc)
        dims = _axes(spec) + ((),) * (rank - len(spec))
        seen: set[str] = set()
        for a in (a for axes in dims for a in axes):
            module.mesh.check_axis(a, tactic=self.label, loc=self.loc, splits=module.splits)
            if a in seen:
                raise InvalidTacticError(f"out_shardings for {name!r}: {spec} names axis "
                                         f"{a!r} twice", tactic=self.label, loc=self.loc)
            seen.add(a)
        return dims


def check_out_shardings(out_shardings: Any) -> Any:
    """`out_shardings` as given, once its leaves are checked (PartitionSpecs, or None)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(out_shardings,
                                                           is_leaf=is_spec_leaf)[0]:
        if leaf is not None:
            _check_leaf(f"at {jax.tree_util.keystr(path) or 'its root'}", leaf,
                        "out_shardings", None)
    return out_shardings


def _check_leaf(where: str, spec: Any, tactic: str, loc: Location | None) -> None:
    if not isinstance(spec, PartitionSpec):
        hint = "; pass its .spec (the mesh is partir's)" if hasattr(spec, "spec") else ""
        raise InvalidTacticError(f"out_shardings {where}: expected a "
                                 f"jax.sharding.PartitionSpec or None, got "
                                 f"{type(spec).__name__} {spec!r}{hint}", tactic=tactic,
                                 loc=loc)


def _axes(spec: PartitionSpec) -> AxesPerDim:
    """Per entry of the spec, the axes it names."""
    return tuple(entry_axes(e) for e in spec)


def _tiled(module: CoreModule, r: int, dim: int, axis: str) -> bool:
    """Whether output `r` is already tiled on `dim` by `axis` (all its parts): tiling it
    again would be an error where an earlier tactic did (an input returned as it is)."""
    producer = module.producer.get(module.results[r])
    if producer is None:
        return False
    uid, k = producer
    tiles = module.info[uid].tiles[k].get(dim, ())
    return all(p in tiles for p in module.mesh.parts(axis) or (axis,))
