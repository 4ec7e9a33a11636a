"""Factor sharding rules: what an op computes, as independent factors of its iteration
space (Shardy's `OpShardingRule`).

A factor is one loop of the op's iteration space, with its size. Every dimension of an
operand or result is made of factors, major to minor: most dimensions of one factor, a
dimension a reshape splits or merges of several (compound), a size-1 dimension JAX
broadcasts of none. A factor is of one kind:

- *pass-through*: it indexes results (and maybe operands); slicing it on every operand
  and result that has it computes a tile of each such result;
- *reduction*: it indexes operands only; slicing it computes partial results to combine
  with its monoid (a `#sum<monoid>` loop);
- *need-replication*: it cannot be sliced (a sorted, scanned or reversed dimension, a
  reduction with no monoid among the `#sum` actions, the index vector of a gather):
  propagation stops there.

A pass-through factor may also be made of operand dimensions that each tile of the
result reads whole (`Factor.whole`: the operands of a concatenate along the concatenated
dimension): the tile is cut out of them where it lies, and an operand tiled there is
gathered first.

A rule is built once from an op's parameters and types (global or device-local alike);
the sizes of its factors give its local shapes inside loops and its FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from partir.ir.monoids import MONOIDS, NAMES

PASS = "pass-through"
REDUCTION = "reduction"
REPLICATION = "need-replication"
KINDS = (PASS, REDUCTION, REPLICATION)

Dims = tuple[tuple[int, ...], ...]  # per dimension of a tensor, its factors major to minor


@dataclass(frozen=True)
class Factor:
    size: int
    kind: str = PASS
    monoid: str | None = None  # how partial results combine, for a reduction factor
    why: str = field(default="", compare=False)  # why a need-replication factor is one
    # (operand, dim) pairs that hold the factor's elements but that every tile of the
    # result reads whole, cutting its chunk out at its offset (a concatenate's operands
    # along the concatenated dim, whose chunk boundaries are not the result's): an
    # operand tiled there is gathered first, and the op's TMR `apply` places the chunk.
    whole: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"factor kind must be one of {KINDS}, got {self.kind!r}")
        if self.whole and self.kind != PASS:
            raise ValueError("only a pass-through factor reads operands whole")
        if (self.kind == REDUCTION) != (self.monoid is not None):
            raise ValueError("a reduction factor, and only it, has a monoid")
        if self.monoid is not None and self.monoid not in MONOIDS:
            raise ValueError(f"unknown monoid {self.monoid!r}; expected one of {NAMES}")


@dataclass(frozen=True)
class ShardingRule:
    factors: tuple[Factor, ...]
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    # Per factor: the dimension of each operand (result) it is part of, None where absent.
    operand_dims: tuple[tuple[int | None, ...], ...] = field(init=False, repr=False,
                                                              compare=False)
    result_dims: tuple[tuple[int | None, ...], ...] = field(init=False, repr=False,
                                                             compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "operand_dims", _positions(len(self.factors), self.operands))
        object.__setattr__(self, "result_dims", _positions(len(self.factors), self.results))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(f.size for f in self.factors)

    def points(self, sizes: Sequence[int] | None = None) -> int:
        """The size of the iteration space: the product of the factors' sizes."""
        return math.prod(self.sizes if sizes is None else sizes)

    def elements_of_operand(self, i: int, sizes: Sequence[int] | None = None) -> int:
        """The product of the sizes of the factors operand i has."""
        sizes = self.sizes if sizes is None else sizes
        return math.prod(sizes[f] for dim in self.operands[i] for f in dim)

    def local_sizes(self, in_shapes: Sequence[Sequence[int]],
                    out_shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
        """Factor sizes of a tile whose operand and result shapes are given: a dimension
        divided by k took k from its factors major to minor (a loop over a compound
        dimension slices its major factor first). A factor takes the smallest size any
        of its dimensions leaves it."""
        local = list(self.sizes)
        for dims_of, shapes in ((self.operands, in_shapes), (self.results, out_shapes)):
            for dims, shape in zip(dims_of, shapes, strict=True):
                for factors, n in zip(dims, shape, strict=True):
                    _divide(local, self.factors, factors, n)
        return tuple(local)

    def majors(self, sizes: Sequence[int]) -> set[int]:
        """The factors that are the major one of every dimension they are part of, at the
        given factor sizes: the first factor of size > 1 (the first if all are 1)."""
        minor: set[int] = set()
        for dims_of in (self.operands, self.results):
            for dims in dims_of:
                for factors in dims:
                    if len(factors) > 1:
                        major = next((f for f in factors if sizes[f] != 1), factors[0])
                        minor.update(f for f in factors if f != major)
        return set(range(len(self.factors))) - minor


def _positions(n: int, dims_of: tuple[Dims, ...]) -> tuple[tuple[int | None, ...], ...]:
    out: list[list[int | None]] = [[None] * len(dims_of) for _ in range(n)]
    for t, dims in enumerate(dims_of):
        for d, factors in enumerate(dims):
            for f in factors:
                out[f][t] = d
    return tuple(tuple(p) for p in out)


def _divide(local: list[int], factors: tuple[Factor, ...], dim: tuple[int, ...],
            n: int) -> None:
    if not dim:
        return
    if len(dim) == 1:
        # One factor: its tile is the dimension's, also when an axis that does not divide
        # it pads it (size ceil(size / axis)), where the ratio below would not be exact.
        local[dim[0]] = min(local[dim[0]], n)
        return
    whole = math.prod(factors[f].size for f in dim)
    taken = whole // n if n else 1
    if taken <= 1:
        return
    for f in dim:
        size = factors[f].size
        if taken >= size and taken % size == 0:
            local[f] = 1
            taken //= size
        else:
            local[f] = min(local[f], size // math.gcd(size, taken))
            break
        if taken == 1:
            break


class RuleBuilder:
    """Builds a rule factor by factor: `factor(size, operands={i: d}, results={k: d})`
    appends the factor to the end (minor side) of the named dimensions."""

    def __init__(self, in_ranks: Sequence[int], out_ranks: Sequence[int]) -> None:
        self.factors: list[Factor] = []
        self.operands = [[[] for _ in range(r)] for r in in_ranks]
        self.results = [[[] for _ in range(r)] for r in out_ranks]

    def factor(self, size: int, operands: Mapping[int, int] | None = None,
               results: Mapping[int, int] | None = None, kind: str = PASS,
               monoid: str | None = None, whole: Mapping[int, int] | None = None) -> int:
        """`whole={i: d}`: operand i's dim d holds the factor's elements but is read
        whole (`Factor.whole`); the dim is not made of this factor."""
        f = len(self.factors)
        self.factors.append(Factor(size, kind, monoid,
                                   whole=tuple(sorted((whole or {}).items()))))
        for i, d in (operands or {}).items():
            self.operands[i][d].append(f)
        for k, d in (results or {}).items():
            self.results[k][d].append(f)
        return f

    def replicated(self, size: int, operands: Mapping[int, int] | None = None,
                   results: Mapping[int, int] | None = None, why: str = "") -> int:
        f = self.factor(size, operands, results, REPLICATION)
        if why:
            self.factors[f] = Factor(size, REPLICATION, why=why)
        return f

    def build(self) -> ShardingRule:
        return ShardingRule(tuple(self.factors),
                            tuple(tuple(tuple(d) for d in t) for t in self.operands),
                            tuple(tuple(tuple(d) for d in t) for t in self.results))
