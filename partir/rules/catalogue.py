"""The primitive catalogue: one declaration per primitive, read by every stage.

A declaration says what a primitive is, once: its factor sharding rule (which drives
propagation and gives local shapes), how its shape parameters follow its local types,
its kind for the fusion and memory models, its FLOPs (from the rule's factor sizes)
and, where a tile's values depend on where it lies, how a tile is computed (`apply`).
The TMR, the simulator and the Core materializer derive everything else from it, the
way Shardy builds one `OpShardingRule` per op and JAX registers rules beside each
primitive.

Names are JAX primitive names, checked against the primitives JAX defines when the
declaration is made: a misspelt or retired name fails at import, not when a program
first uses it. partir's own ops (`partir.tag`, the Core value actions, PartIR:HLO
collectives) are declared with `jax=False`, and only under a namespace (`partir.`,
`hlo.`): JAX's names have none, so none of partir's ops can be taken for a JAX primitive.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

from jax.extend.core import Primitive as JaxPrimitive

from partir.ir.types import TensorType
from partir.registry import Registry
from partir.rules.factors import ShardingRule


class Kind(IntEnum):
    FREE = 0  # no kernel, no buffer: the result is the operand's buffer (reshape, tag)
    ELEMENTWISE = 1  # fusible; one output element from the same elements of the operands
    BROADCAST = 2  # fusible and cheap enough to duplicate into every consumer
    MOVEMENT = 3  # fusible data movement: transpose, slice, pad, concatenate, all_slice
    REDUCTION = 4  # fusible as a consumer (XLA's input fusion), a fusion root
    KERNEL = 5  # its own kernel: matmuls, convolutions, gathers, scatters, sorts
    COLLECTIVE = 6  # communication, costed by partir.sim.collectives


@dataclass(frozen=True)
class OpView:
    """What a declaration sees of an op: its name, parameters and operand/result types.
    The types are global in a Core program and device-local in PartIR:HLO; a rule built
    from either describes that op."""

    name: str
    params: Mapping[str, Any]
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]
    # A control-flow op's bodies (`partir.ir.Region`s, on the op's global types).
    regions: tuple[Any, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, op: Any) -> OpView:
        """The view of an IR op as it stands: its operands' and results' types, its
        regions."""
        return cls(op.name, op.params, tuple(v.type for v in op.operands),
                   tuple(v.type for v in op.results), regions=tuple(op.regions))

    @property
    def in_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.in_types)

    @property
    def out_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.out_types)


RuleFn = Callable[[OpView], ShardingRule]
# flops(view, rule): the op's FLOPs, from its rule's factor sizes where it has one.
FlopsFn = Callable[[OpView, "ShardingRule | None"], float]
# localize(view on local types, global params) -> the local op's parameters.
LocalizeFn = Callable[[OpView], dict[str, Any]]


class TileContext(Protocol):
    """Where an op's local tile lies in its global operands and results, for an `apply`.

    Offsets are int32 scalars computed from the loop indices or the device's coordinates
    (traced), or Python ints: an apply computes with operations valid for both."""

    in_types: tuple[TensorType, ...]  # the op's global types
    out_types: tuple[TensorType, ...]

    def operand_offset(self, i: int, dim: int) -> Any:
        """Start of operand i's local tile along `dim` in the global operand."""

    def slices_operand(self, i: int, dim: int) -> bool:
        """Whether operand i arrives sliced along `dim` (not told by the local size: a
        padded dimension of size 1 has local tiles of size 1)."""

    def result_offset(self, k: int, dim: int) -> Any:
        """Start of result k's local tile along `dim` in the global result."""

    def cut(self, value: Any, k: int, dim: int, size: int) -> Any:
        """Result k's local tile of `size` along `dim`, cut out of `value`, the whole
        result along that dim."""

    def sums_result(self, k: int) -> bool:
        """Whether the tiles' results k are summed (with the factor's monoid) into the
        result, rather than each being a tile of it."""

    def is_first(self, k: int) -> Any:
        """True on exactly one of the tiles whose results k are summed: terms to be
        added once, not once per tile, are kept there."""


# apply(view on local types with localized params, the JAX primitive, local operands,
# where the tile lies) -> the local results.
ApplyFn = Callable[[OpView, Any, Sequence[Any], TileContext], list[Any]]




@dataclass(frozen=True)
class Edge:
    """A data-flow edge between one of an op's values and one of its regions' (Shardy's
    `ShardableDataFlowOpInterface`): operand (or result) `value` and argument (or yield)
    `position` of region `region`. The op's value has `lead` more leading dimensions,
    one per iteration (a scan's scanned operands and stacked results); the others are
    the same dimensions on both sides, sharded alike."""

    value: int
    region: int
    position: int
    lead: int = 0


@dataclass(frozen=True)
class Carry:
    """A loop-carried value: operand `operand` is the arguments `args` (region,
    position) of the first iteration, the yield `made` (region, position) of each
    iteration is them in the next, and result `result` after the last."""

    operand: int
    args: tuple[tuple[int, int], ...]
    made: tuple[int, int]
    result: int


@dataclass(frozen=True)
class DataFlow:
    """How a control-flow op's operands and results meet its regions' values."""

    entries: tuple[Edge, ...]  # operand -> region argument, anew each iteration
    exits: tuple[Edge, ...]  # region yield -> result, made anew each iteration
    carries: tuple[Carry, ...] = ()
    predicate: tuple[int, int] | None = None  # (region, yield): a while loop's condition
    # How often one run of the op runs each region: a count, or None where the run
    # decides (a while loop's); `alternatives`: one of the regions runs (a cond's branches).
    trips: tuple[int | None, ...] = ()
    alternatives: bool = False

    @functools.cached_property
    def leads(self) -> dict[tuple[str, int], int]:
        """("entry" | "exit", operand or result) -> how many leading dimensions of it its
        regions' values do not have (a scan's scanned operand or stacked result), from
        its first edge; made once per flow, which `data_flow` keeps per op."""
        leads: dict[tuple[str, int], int] = {}
        for kind, edges in (("entry", self.entries), ("exit", self.exits)):
            for e in edges:
                leads.setdefault((kind, e.value), e.lead)
        return leads


# data_flow(view) -> the op's data-flow edges (its regions may be absent from the view
# where only its carries are asked for).
DataFlowFn = Callable[[OpView], DataFlow]

# canonical(op, producer) -> the ops computing op's results in the form its rule
# partitions best, or None to keep it; `producer` gives the op that computes a value, or
# None (an argument, a value of an enclosing region). Applied as the frontend emits ops.
CanonicalFn = Callable[[Any, Callable[[Any], Any]], list[Any] | None]


# How partial sums pass through an op (`Primitive.linear`): the op of the sums is the sum
# of the op's results on the summands when its operands are partial sums (over the same
# slices) as follows. "all": every operand, literals excluded (add, reshape); "one":
# exactly one, the others the same on every slice (mul, dot_general); "cases": all but
# the first, which is the same on every slice (select_n); a tuple: the operands at those
# positions, the others the same on every slice (div's numerator).
Linearity = str | tuple[int, ...]


@dataclass(frozen=True)
class Primitive:
    kind: Kind
    flops: FlopsFn
    # None: no sharding rule yet, so the op is used whole and propagation reports it.
    rule: RuleFn | None = None
    localize: LocalizeFn | None = None
    matmul: bool = False  # runs on the matrix units (DeviceSpec.matmul_flops)
    # Transcendentals and the like: the fusion heuristic does not duplicate them into
    # several consumers (XLA's "expensive" elementwise ops).
    expensive: bool = False
    # Where a tile's values depend on where the tile lies (iota, gather from a sliced
    # table...), the local computation of a tile: the op cannot just run smaller.
    apply: ApplyFn | None = None
    # Whether a factor earlier axes tiled may be padded (each of their tiles padded): not
    # a control-flow op's edges (`partir.rules.edges`), which lay out its regions'
    # arguments and yields as SPMD types, where only a dimension's major axis may pad.
    pads_tiles: bool = True
    linear: Linearity | None = None  # None: a partial sum must be summed before it
    data_flow: DataFlowFn | None = None  # an op with regions: how its values meet theirs
    canonical: CanonicalFn | None = None
    doc: str = field(default="", compare=False)

    @property
    def positional(self) -> bool:
        return self.apply is not None


CATALOGUE: Registry[Primitive] = Registry("primitive declaration")


# Names declared with `jax=False`: partir's own ops.
OWN_NAMES: set[str] = set()


def is_namespaced(name: str) -> bool:
    """Whether `name` is in a namespace of partir's (`partir.tag`, `hlo.all_gather`)."""
    return "." in name


@functools.cache
def jax_primitive_names() -> frozenset[str]:
    """Names of the primitives JAX has defined: module-level objects, created when jax and
    its numpy and random modules are imported. partir's own primitive (`partir.tag`) is
    not one of them, whether or not it exists yet."""
    import jax.numpy
    import jax.random  # noqa: F401
    return frozenset(o.name for o in gc.get_objects()
                     if isinstance(o, JaxPrimitive) and not is_namespaced(o.name))


def declare(names: str | Iterable[str], primitive: Primitive, *, jax: bool = True
            ) -> Primitive:
    names = [names] if isinstance(names, str) else list(names)
    if jax:
        unknown = sorted(set(names) - jax_primitive_names())
        if unknown:
            raise ValueError(f"declared primitives {unknown} are not JAX primitives")
    else:
        bare = sorted(n for n in names if not is_namespaced(n))
        if bare:
            raise ValueError(f"partir's own ops {bare} need a namespace (partir.<name>), "
                             f"so they cannot be taken for JAX primitives")
    CATALOGUE.register(names, primitive)
    if not jax:
        OWN_NAMES.update(names)
    return primitive


# --- FLOP counts from the factors -------------------------------------------------------


def flops_of(primitive: Primitive, view: OpView) -> float:
    """The op's FLOPs. A control-flow op's are its regions' ops', which need no rule of
    the op itself."""
    rule = None if primitive.rule is None else primitive.rule(view)
    return primitive.flops(view, rule)


def data_flow(op: Any) -> DataFlow | None:
    """The data-flow edges of an op with regions (None: not a control-flow primitive)."""
    prim = CATALOGUE.get(op.name) if op.regions else None
    if prim is None or prim.data_flow is None:
        return None
    # Asked once per edge of the op, by each pass: a loop with hundreds of operands (a
    # pipeline's steps read every layer's residuals) would build its edges that often.
    # Ops are never changed in place, so an op's flow is remembered while the op is.
    found = _FLOWS.get(id(op))
    if found is not None and found[0] is op:
        return found[1]
    if len(_FLOWS) >= _FLOWS_BOUND:
        _FLOWS.clear()
    flow = prim.data_flow(OpView.of(op))
    _FLOWS[id(op)] = (op, flow)
    return flow


# id(op) -> (op, its DataFlow): the entry holds the op, so its id is not reused meanwhile.
_FLOWS: dict[int, tuple[Any, DataFlow]] = {}
_FLOWS_BOUND = 4096


def region_ops(op: Any, times: int | None = 1) -> Iterator[tuple[Any, int | None]]:
    """The ops inside an op's regions, nested ones included, each with how often one run
    of the op runs it (None: unknown; its data-flow declaration's `trips`), each
    alternative region as if it were taken. The partitioner's own ops with a region (a
    Core loop, an SPMD execute) run it once per iteration, counted here as once."""
    if not op.regions:
        return
    flow = data_flow(op)
    trips = flow.trips if flow is not None else (1,) * len(op.regions)
    for region, n in zip(op.regions, trips, strict=True):
        inner_times = None if times is None or n is None else times * n
        for inner in region.ops:
            yield inner, inner_times
            if inner.regions:
                yield from region_ops(inner, inner_times)


def region_flops(view: OpView, rule: ShardingRule | None) -> float:
    """The FLOPs of an op that runs regions: each region's ops' times its trips (once
    where the run decides), the costliest region where one of them runs."""
    flow = CATALOGUE[view.name].data_flow(view)
    per_region = []
    for region, n in zip(view.regions, flow.trips, strict=True):
        total = 0.0
        for op in region.ops:
            prim = CATALOGUE.get(op.name)
            if prim is not None:
                total += flops_of(prim, OpView.of(op))
        per_region.append((1 if n is None else n) * total)
    return max(per_region) if flow.alternatives else sum(per_region)


def no_flops(view: OpView, rule: ShardingRule | None) -> float:
    return 0.0


def per_point(weight: float) -> FlopsFn:
    """`weight` FLOPs per point of the iteration space (the product of the factor sizes):
    per output element of an elementwise op, per input element of a reduction, per
    multiply-add of a matmul (weight 2)."""
    def flops(view: OpView, rule: ShardingRule | None) -> float:
        return float(weight * rule.points())
    return flops
