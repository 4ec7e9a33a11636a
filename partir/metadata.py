"""What partitioning reports: per tactic and for the final program. Plain data, JSON-able
(`to_json`) and picklable, except `in_specs`/`out_specs`, which are pytrees of
`PartitionSpec` like `jax.jit`'s shardings.

Some fields cost more to compute than the partitioning they describe: the IR texts of a
large program, an intermediate tactic's collectives and cost, which need its program
lowered and simulated, and the shardings of every tactic's inputs and outputs. These are
`Lazy` fields: their value may be given as a `Deferred` computation, run on first read
(and its error raised there), then kept. Equality, `repr`, `to_json` and pickling read
every field, so they see plain values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Generic, TypeVar

import jax
from jax.sharding import PartitionSpec

from partir.sim import Cost

T = TypeVar("T")


class Deferred(Generic[T]):
    """A value computed when first needed, once, however many fields share it."""

    def __init__(self, compute: Callable[[], T]) -> None:
        self._compute: Callable[[], T] | None = compute
        self._value: T | None = None

    def get(self) -> T:
        if self._compute is not None:
            self._value = self._compute()
            self._compute = None  # frees what the computation held (e.g. a program)
        return self._value  # type: ignore[return-value]


class Lazy:
    """A dataclass field whose instance value may be a `Deferred`, resolved on first read.
    The value lives in the instance's `__dict__` under the field's own name."""

    def __init__(self, default: Any = MISSING) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            # The dataclass's default; without one, AttributeError means "no default".
            if self.default is MISSING:
                raise AttributeError(self.name)
            return self.default
        value = obj.__dict__[self.name]
        if isinstance(value, Deferred):
            value = obj.__dict__[self.name] = value.get()
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value


class _Resolved:
    """Pickles with every `Lazy` field computed: a `Deferred` holds a closure."""

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def replaced(self: T, **changes: Any) -> T:
        """A copy with `changes`, the other fields as they are: one still deferred stays
        so (`dataclasses.replace` reads, so computes, every field)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, **changes)
        return new


@dataclass
class TacticMetadata(_Resolved):
    name: str
    axis: str
    actions: list[str]
    collectives: dict[str, int] = Lazy()
    # How many of each run per call: a loop body's as often as its loops run it.
    executed_collectives: dict[str, int] = Lazy()
    shardings: dict[str, list[list[str]]] = Lazy()  # input/output name -> per-dim mesh axes
    conflicts: list[dict[str, Any]]
    notes: list[str]
    core_ir: str = Lazy()
    elapsed_s: float
    # The simulator's estimate for the program after this tactic.
    cost: Cost | None = Lazy(None)
    # An automatic tactic's search: the decisions found (input or tag, dim, axis) and
    # statistics (evaluations, best cost over time); None for a manual tactic.
    search: dict[str, Any] | None = None
    # A pipeline tactic's schedule: stages, layers_per_stage, microbatches, steps and
    # bubble (the fraction of its steps each stage idles); None for other tactics.
    pipeline: dict[str, Any] | None = None
    # Dimensions the tiling pads (an axis that does not divide them), as
    # `partir.core.padding.padding_report` gives them: value, dim, size, padded, axes,
    # wasted_bytes, wasted_flops.
    padding: list[dict[str, Any]] = Lazy(())


@dataclass
class Metadata(_Resolved):
    tactics: list[TacticMetadata] = field(default_factory=list)
    # For an input (output) whose axes pad a dimension, the spec lays out the padded
    # array (`padding` names it): JAX places only arrays its mesh axes divide, and the
    # partitioned function pads (cuts) that value itself.
    in_specs: tuple = ()
    out_specs: tuple = ()
    core_ir: str = Lazy("")
    spmd_ir: str = Lazy("")
    hlo_ir: str = Lazy("")
    stablehlo: str | None = Lazy(None)  # partir.jit's executable module as StableHLO text
    # Collectives the program holds, those inside loop bodies included ...
    collectives: dict[str, int] = field(default_factory=dict)
    # ... and how many of each run per call (a loop body's as often as its loops run it:
    # a scan's `length` times, a while loop's once, its trip count being unknown).
    executed_collectives: dict[str, int] = field(default_factory=dict)
    cost: Cost | None = None  # the simulator's estimate for the final program
    # The final program's padded dimensions (see TacticMetadata.padding).
    padding: list[dict[str, Any]] = Lazy(())
    # Notes on the program rather than a tactic: the model's sharding annotations the
    # schedule ignores.
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["in_specs"] = _specs_to_json(self.in_specs)
        out["out_specs"] = _specs_to_json(self.out_specs)
        return out


def _specs_to_json(specs: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda s: [list(a) if isinstance(a, tuple) else a for a in s], specs,
        is_leaf=lambda s: isinstance(s, PartitionSpec))
