"""ManualPartition: shard named inputs (and tagged values) along one mesh axis.

It expands to value actions, one per selected value (`tile<%x, 0, "batch">`,
`atomic<%w, "batch">`), in the order of the input dict and of the selected leaves,
followed by `propagate` (paper, section 3).
"""

from __future__ import annotations

import difflib
import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from partir.errors import InvalidTacticError, UnknownInputError
from partir.frontend.source import is_user_file
from partir.ir import Location, Value
from partir.tactics.base import Tactic, TacticResult
from partir.tactics.forms import (
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
    """One action a tactic asks for: tile (dim is an int) or atomic (dim is None)."""

    kind: str  # "tile" | "atomic"
    name: str
    value: Value
    axis: str
    dim: int | None = None

    def __str__(self) -> str:
        if self.kind == "tile":
            return f'tile<%{self.name},{self.dim},"{self.axis}">'
        return f'atomic<%{self.name},"{self.axis}">'


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
        out = []
        for key, form in self.inputs.items():
            matched = [n for n in names if n == key or n.startswith(key + "/")]
            if not matched:
                raise UnknownInputError(_unknown_message(key, names), tactic=self.label,
                                        loc=self.loc)
            for n in matched:
                out += [(n, v, form) for v in names[n]]
        return out


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
        if form is REPLICATED:
            specs.append(ActionSpec("atomic", name, value, tactic.axis))
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
    from partir.core.value_actions import BodyValue, atomic_value, tile_body_value, tile_value

    seeds: list[int] = []
    actions: list[str] = []
    for spec in specs:
        in_body = isinstance(spec.value, BodyValue)
        if in_body and spec.kind != "tile":
            raise InvalidTacticError(
                f"{spec.name!r} is a value inside a loop's body: it can be tiled, not kept "
                f"replicated (keep the loop's operand replicated instead)",
                tactic=tactic, loc=loc)
        if spec.kind == "tile":
            if in_body:
                seeds += tile_body_value(module, spec.value, spec.dim, spec.axis,
                                         label=f"body value {spec.name!r}", tactic=tactic,
                                         loc=loc, pad=pad)
            else:
                seeds += tile_value(module, spec.value, spec.dim, spec.axis,
                                    label=f"input {spec.name!r}", tactic=tactic, loc=loc,
                                    pad=pad)
            spec = ActionSpec("tile", spec.name, spec.value, spec.axis,
                              spec.dim % spec.value.type.rank)
        else:
            seeds += atomic_value(module, spec.value, spec.axis, label=f"input {spec.name!r}",
                                  tactic=tactic, loc=loc)
        actions.append(str(spec))
    start = time.perf_counter()
    propagate(module, seeds, pad=pad)
    actions.append("propagate")
    return actions, time.perf_counter() - start


def _check_form(value: Any, what: str, tactic: str, loc: Location) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | _Form) or callable(value)):
        raise InvalidTacticError(
            f"{what}: expected a dimension (int), partir.REPLICATED, "
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


__all__ = ["FIRST_DIVISIBLE_DIM", "REPLICATED", "UNKNOWN", "ActionSpec", "ManualPartition",
           "expand", "issue", "resolve_form"]
