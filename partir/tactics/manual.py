"""ManualPartition: shard named inputs (and tagged values) along one mesh axis.

It expands to value actions, one per selected value (`tile<%x, 0, "batch">`,
`atomic<%w, "batch">`), in the order of the input dict and of the selected leaves,
followed by `propagate` (paper, section 3).
"""

from __future__ import annotations

import difflib
import inspect
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import PartitionSpec

from partir.errors import DimensionOutOfRangeError, InvalidTacticError, UnknownInputError
from partir.frontend.names import path_to_name
from partir.frontend.source import is_user_file
from partir.ir import Location, Value
from partir.tactics.base import Tactic, TacticResult
from partir.tactics.forms import (
    BARRIER,
    FIRST_DIVISIBLE_DIM,
    REPLICATED,
    UNKNOWN,
    _FirstDivisible,
    _Form,
)

if TYPE_CHECKING:
    from partir.core.module import CoreModule

InputValue = int | _Form | Callable[[str, tuple[int, ...]], Any]


def caller_location() -> Location:
    """The first stack frame in the user's code (not partir's, JAX's or generated code
    such as dataclass `__init__`s): where the user wrote the tactic."""
    frame = inspect.currentframe()
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return Location(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return Location("<unknown>", 0)


@dataclass(frozen=True)
class ActionSpec:
    """One action a tactic asks for: tile (dim is an int), atomic or barrier (dim is
    None)."""

    kind: str  # "tile" | "atomic" | "barrier"
    name: str
    value: Value
    axis: str
    dim: int | None = None

    def __str__(self) -> str:
        if self.kind == "tile":
            return f'tile<%{self.name},{self.dim},"{self.axis}">'
        return f'{self.kind}<%{self.name},"{self.axis}">'


@dataclass
class ManualPartition(Tactic):
    inputs: Mapping[str, InputValue]
    axis: str
    name: str | None = None
    loc: Location = field(default_factory=caller_location, compare=False)
    # A dimension the axis does not divide is padded to the next multiple (and sliced
    # back); pad=False makes it an IndivisibleDimensionError (and an `indivisible`
    # conflict in propagation) instead.
    pad: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, Mapping):
            raise InvalidTacticError(
                f"ManualPartition inputs must be a dict of name -> dimension, got "
                f"{type(self.inputs).__name__}", tactic=self.label, loc=self.loc)
        if not isinstance(self.axis, str):
            raise InvalidTacticError(f"ManualPartition axis must be a mesh axis name, got "
                                     f"{self.axis!r}", tactic=self.label, loc=self.loc)
        if not isinstance(self.pad, bool):
            raise InvalidTacticError(f"ManualPartition pad must be True or False, got "
                                     f"{self.pad!r}", tactic=self.label, loc=self.loc)
        for key, value in self.inputs.items():
            _check_form(value, f"input {key!r}", self.label, self.loc)

    @property
    def label(self) -> str:
        return self.name or f"ManualPartition({self.axis!r})"

    @property
    def axis_label(self) -> str:
        return self.axis

    def key_items(self) -> list[tuple[str, Any]]:
        return [*self.inputs.items(), ("pad", self.pad)]

    def run(self, module: CoreModule, names: Mapping[str, list[Value]]) -> TacticResult:
        specs, notes = expand(self, module, names)
        actions, prop_s = issue(module, specs, self.label, self.loc, pad=self.pad)
        return TacticResult(actions, notes, prop_s)

    def select(self, names: Mapping[str, list[Value]]) -> list[tuple[str, Any, InputValue]]:
        """The (name, value, form) triples the input dict selects, in order."""
        return select(self.inputs.items(), names, self.label, self.loc)

    @staticmethod
    def from_specs(specs: Any, name: str | None = None, pad: bool = True) -> SpecPartition:
        """The tactic that tiles inputs as `jax.sharding.PartitionSpec`s say: one tile
        action per mesh axis a spec names (the axes of one dimension major first), then
        propagation (`SpecPartition`).

        `specs` is a tuple of one pytree per positional argument of the function (static
        ones left out, as `jax.jit`'s `in_shardings`), each a prefix of the argument's
        pytree with a PartitionSpec or None ("no spec") at its leaves; or a dict of input
        (or tag) name -> spec, or pytree of specs under that name, a name applying to
        every input under it: `{"params": flax.linen.get_partition_spec(params)}`,
        `nnx.get_partition_spec(state)` or a checkpoint's layout."""
        return SpecPartition(specs, name, pad=pad)


def select(items: Iterable[tuple[str, Any]], names: Mapping[str, list[Value]], tactic: str,
           loc: Location) -> list[tuple[str, Any, Any]]:
    """(name, value, what) for every value named by or under each item's name, in order;
    a name that selects nothing is an UnknownInputError that suggests names."""
    out = []
    for key, what in items:
        matched = [n for n in names if n == key or n.startswith(key + "/")]
        if not matched:
            raise UnknownInputError(_unknown_message(key, names), tactic=tactic, loc=loc)
        for n in matched:
            out += [(n, v, what) for v in names[n]]
    return out


def is_spec_leaf(x: Any) -> bool:
    """A leaf of a spec pytree: a PartitionSpec, or None (no spec)."""
    return x is None or isinstance(x, PartitionSpec)


def entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names (None: none; a name; a tuple)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def spec_axes(spec: PartitionSpec, shape: tuple[int, ...], label: str, tactic: str,
              loc: Location) -> list[tuple[str, ...] | None]:
    """Per dimension of a value of `shape`, the mesh axes the spec tiles it on, major
    first; None where the spec is `P.UNCONSTRAINED`. Dimensions past the spec's end are
    replicated, as JAX reads a short spec; a spec longer than the value's rank is a
    DimensionOutOfRangeError."""
    if len(spec) > len(shape):
        raise DimensionOutOfRangeError(
            f"{label} has {len(shape)} dimension{'s' if len(shape) != 1 else ''} (shape "
            f"{list(shape)}), but its spec {spec} has {len(spec)} entries", tactic=tactic,
            loc=loc)
    out: list[tuple[str, ...] | None] = []
    for entry in (*spec, *(None,) * (len(shape) - len(spec))):
        if entry is PartitionSpec.UNCONSTRAINED:
            out.append(None)
        else:
            out.append(entry_axes(entry))
    return out


def spec_tiles(name: str, value: Any, axes: list[tuple[str, ...] | None]
               ) -> list[tuple[int, ActionSpec]]:
    """The tile actions that shard a value as `spec_axes` says, each with its round
    (`issue_rounds`): the position of its axis among its dimension's, major first."""
    return [(k, ActionSpec("tile", name, value, a, d)) for d, dim_axes in enumerate(axes)
            if dim_axes for k, a in enumerate(dim_axes)]


def issue_rounds(module: CoreModule, ranked: list[tuple[int, ActionSpec]], tactic: str,
                 loc: Location, pad: bool) -> tuple[list[str], float]:
    """`issue` the actions round by round, each round then propagated: a dimension's
    minor axis then tiles the tiles its major axis made of the value's uses (a deep loop
    nest), as a later tactic's would."""
    actions: list[str] = []
    prop_s = 0.0
    for k in sorted({k for k, _ in ranked}) or [0]:
        acts, s = issue(module, [a for r, a in ranked if r == k], tactic, loc, pad=pad)
        actions += acts
        prop_s += s
    return actions, prop_s


@dataclass
class SpecPartition(Tactic):
    """Tile inputs (and tagged values) as PartitionSpecs say (`ManualPartition.from_specs`):
    a dimension whose spec names axes is tiled on each in turn, major first; dimensions a
    spec leaves unsharded (None, `P.UNCONSTRAINED`) are left to propagation, as a
    ManualPartition leaves what it does not name. One propagation follows the tiles of
    every major axis, another those of the next axes of dimensions with several, ..."""

    specs: Any
    name: str | None = None
    loc: Location = field(default_factory=caller_location, compare=False)
    pad: bool = True  # as ManualPartition.pad

    def __post_init__(self) -> None:
        if not isinstance(self.specs, Mapping | tuple | list | PartitionSpec):
            raise InvalidTacticError(
                f"ManualPartition.from_specs takes a tuple of PartitionSpec pytrees (one per "
                f"positional argument) or a dict of input name -> spec, got "
                f"{type(self.specs).__name__}", tactic=self.label, loc=self.loc)
        for leaf in jax.tree.leaves(self.specs, is_leaf=is_spec_leaf):
            if not is_spec_leaf(leaf):
                raise InvalidTacticError(f"ManualPartition.from_specs takes PartitionSpecs "
                                         f"(or None) at the leaves, got {leaf!r}",
                                         tactic=self.label, loc=self.loc)

    @property
    def label(self) -> str:
        return self.name or "ManualPartition.from_specs"

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh axes the specs name, in the order they first do."""
        axes: dict[str, None] = {}
        for spec in jax.tree.leaves(self.specs, is_leaf=is_spec_leaf):
            for entry in spec or ():
                if entry is not PartitionSpec.UNCONSTRAINED and entry is not None:
                    axes.update(dict.fromkeys((entry,) if isinstance(entry, str) else entry))
        return tuple(axes)

    @property
    def axis_label(self) -> str:
        return ",".join(self.axis_names)

    def key_items(self) -> list[tuple[str, Any]]:
        # PartitionSpecs and the containers of a spec pytree print what they hold.
        return [("specs", repr(self.specs)), ("pad", self.pad)]

    def named_specs(self, module: CoreModule) -> list[tuple[str, PartitionSpec | None]]:
        """(input name or name prefix, spec) for every leaf of the specs, in order."""
        if isinstance(self.specs, Mapping):
            return [(path_to_name(str(key), path), spec) for key, tree in self.specs.items()
                    for path, spec in jax.tree_util.tree_flatten_with_path(
                        tree, is_leaf=is_spec_leaf)[0]]
        traced = module.traced
        names_tree = jax.tree_util.tree_unflatten(traced.in_tree, traced.input_names)
        out: list[tuple[str, PartitionSpec | None]] = []
        try:
            jax.tree.map(lambda spec, sub: out.extend((n, spec) for n in jax.tree.leaves(sub)),
                         tuple(self.specs) if isinstance(self.specs, list) else self.specs,
                         names_tree, is_leaf=is_spec_leaf)
        except ValueError as e:
            raise InvalidTacticError(f"the specs are not a prefix of the inputs' pytree (a "
                                     f"tuple of the positional arguments): {e}",
                                     tactic=self.label, loc=self.loc) from e
        return out

    def run(self, module: CoreModule, names: Mapping[str, list[Value]]) -> TacticResult:
        for axis in self.axis_names:
            module.mesh.check_axis(axis, tactic=self.label, loc=self.loc, splits=module.splits)
        ranked: list[tuple[int, ActionSpec]] = []
        named = [(n, spec) for n, spec in self.named_specs(module) if spec is not None]
        for n, value, spec in select(named, names, self.label, self.loc):
            ranked += spec_tiles(n, value, spec_axes(spec, value.type.shape, repr(n),
                                                     self.label, self.loc))
        actions, prop_s = issue_rounds(module, ranked, self.label, self.loc, self.pad)
        return TacticResult(actions, [], prop_s)


def expand(tactic: ManualPartition, module: CoreModule,
           names: Mapping[str, list[Value]]) -> tuple[list[ActionSpec], list[str]]:
    """The actions a ManualPartition issues, and notes on inputs it left alone."""
    from partir.core.value_actions import sharded_dims

    n = module.mesh.check_axis(tactic.axis, tactic=tactic.label, loc=tactic.loc,
                               splits=module.splits)
    specs: list[ActionSpec] = []
    notes: list[str] = []
    for name, value, form in tactic.select(names):
        form = resolve_form(form, name, value.type.shape, tactic.label, tactic.loc)
        if form is UNKNOWN:
            continue
        if form is REPLICATED or form is BARRIER:
            specs.append(ActionSpec("atomic" if form is REPLICATED else "barrier", name,
                                    value, tactic.axis))
        elif isinstance(form, _FirstDivisible):
            taken = sharded_dims(module, value)
            dims = [d for d, s in enumerate(value.type.shape)
                    if d >= form.start and d not in taken and s % n == 0]
            if dims:
                specs.append(ActionSpec("tile", name, value, tactic.axis, dims[0]))
            else:
                notes.append(f"{name} {list(value.type.shape)}: no unsharded dimension divisible "
                             f"by {n}; left as is")
        elif isinstance(form, int):
            specs.append(ActionSpec("tile", name, value, tactic.axis, form))
        else:
            raise InvalidTacticError(f"unsupported value {form!r} for {name!r}",
                                     tactic=tactic.label, loc=tactic.loc)
    return specs, notes


def issue(module: CoreModule, specs: list[ActionSpec], tactic: str, loc: Location | None,
          pad: bool = False) -> tuple[list[str], float]:
    """Apply the actions in order, then propagate from them: the actions as issued
    (negative dims made positive, then `propagate`) and the propagation's time. With
    `pad`, dimensions an axis does not divide are padded (`ManualPartition.pad`)."""
    from partir.core.propagation import propagate
    from partir.core.value_actions import atomic_value, tile_value

    seeds: list[int] = []
    actions: list[str] = []
    for spec in specs:
        if spec.kind == "tile":
            seeds += tile_value(module, spec.value, spec.dim, spec.axis,
                                label=f"input {spec.name!r}", tactic=tactic, loc=loc, pad=pad)
            spec = ActionSpec("tile", spec.name, spec.value, spec.axis,
                              spec.dim % spec.value.type.rank)
        else:
            seeds += atomic_value(module, spec.value, spec.axis, label=f"input {spec.name!r}",
                                  tactic=tactic, loc=loc, barrier=spec.kind == "barrier")
        actions.append(str(spec))
    start = time.perf_counter()
    propagate(module, seeds, pad=pad)
    actions.append("propagate")
    return actions, time.perf_counter() - start


def _check_form(value: Any, what: str, tactic: str, loc: Location) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | _Form) or callable(value)):
        raise InvalidTacticError(
            f"{what}: expected a dimension (int), partir.REPLICATED, partir.BARRIER, "
            f"partir.FIRST_DIVISIBLE_DIM, partir.UNKNOWN or a callable (name, shape) -> one "
            f"of these; got {value!r}", tactic=tactic, loc=loc)


def resolve_form(form: InputValue, name: str, shape: tuple[int, ...], tactic: str,
                 loc: Location) -> int | _Form:
    if callable(form) and not isinstance(form, _Form):
        result = form(name, shape)
        if callable(result) and not isinstance(result, _Form):
            raise InvalidTacticError(f"the rule for {name!r} returned a callable",
                                     tactic=tactic, loc=loc)
        _check_form(result, f"the rule for {name!r} returned", tactic, loc)
        return result
    return form


def _unknown_message(key: str, names: Mapping[str, Any]) -> str:
    candidates = set(names)
    for n in names:
        parts = n.split("/")
        candidates.update("/".join(parts[:i]) for i in range(1, len(parts)))
    close = difflib.get_close_matches(key, sorted(candidates), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    top = sorted({n.split("/")[0] for n in names})
    return (f"no input, output or tag named {key!r}{hint} (inputs, outputs and tags: "
            f"{', '.join(top[:12])}{', ...' if len(top) > 12 else ''})")


__all__ = ["BARRIER", "FIRST_DIVISIBLE_DIM", "REPLICATED", "UNKNOWN", "ActionSpec",
           "ManualPartition", "SpecPartition", "entry_axes", "expand", "is_spec_leaf", "issue",
           "issue_rounds", "resolve_form", "select", "spec_axes", "spec_tiles"]
