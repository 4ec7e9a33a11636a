"""The two value actions: `tile<value, dim, axis>` and `atomic<value, axis>` (with its
variant `barrier<value, axis>`, whose loop keeps the value whole but not its readers);
and tile on a value tagged inside a loop's bodies, which slices the loop op itself.

Both insert an identity loop on the value and make its uses read the loop's result. Uses
that already slice the value (after earlier tactics) get a *deep* loop nest that repeats
their slicing before the new axis (appendix B), so the new tiling refines the old one and
never undoes it; uses with different slicing contexts get one loop nest each.

Identity loops earlier actions put on the value are looked through: the new loop goes
between them and the ops that compute with the value, so what it asks (a tiling, or
staying replicated) reaches those ops directly.
"""

from __future__ import annotations

import math
from collections import defaultdict

from partir.core.actions import ANY, AnyAction, Loop, Tile
from partir.core.module import CoreModule
from partir.errors import (
    AlreadyTiledError,
    DimensionOutOfRangeError,
    IndivisibleDimensionError,
)
from partir.ir import Location, TensorType, Value
from partir.ir.opnames import ATOMIC, TILE
from partir.ir.types import padded_size, tile_size


def _use_contexts(m: CoreModule, value: Value
                  ) -> dict[tuple[Value, tuple], tuple[list, list]]:
    """The uses (and output positions) of the value, through the identity loops of
    earlier actions on it, grouped by the value they read and how they slice it."""
    groups: dict[tuple[Value, tuple], tuple[list, list]] = defaultdict(lambda: ([], []))
    chain = [value]
    for v in chain:
        uses = m.uses.get(v, ())
        for uid, i in uses:
            if m.by_uid[uid].is_identity:
                chain.append(m.by_uid[uid].results[0])
            else:
                groups[(v, m.slicing(uid, i))][0].append((uid, i))
        outputs = m.output_positions(v)
        for r in outputs:
            groups[(v, ())][1].append(r)
        if not uses and not outputs:
            # Nothing reads the value (an input the function ignores, or the end of a
            # chain of actions on it): the action still lays it out, on a loop nest of
            # its own that repeats the tiling it has (`materialize` keeps such a loop).
            groups.setdefault((v, _tiling(m, v)), ([], []))
    return dict(sorted(groups.items(), key=lambda kv: len(kv[0][1])))


def _tiling(m: CoreModule, v: Value) -> tuple[tuple[str, int], ...]:
    """The (axis, dim) tiles of v its producer's loop nest makes, outermost first."""
    p = m.producer.get(v)
    if p is None:
        return ()
    return tuple((lp.axis, a.dim) for lp in m.nest(p[0])
                 if isinstance(a := lp.results[p[1]], Tile))


def _context_loops(ctx: tuple[tuple[str, int], ...]) -> tuple[Loop, ...]:
    return tuple(Loop(axis, (Tile(d),), (d,)) for axis, d in ctx)


def local_dim_size(m: CoreModule, value: Value, dim: int,
                   ctx: tuple[tuple[str, int], ...]) -> int:
    size = value.type.shape[dim]
    for axis, d in ctx:
        if d == dim:
            size = tile_size(size, m.mesh[axis])
    return size


def sharded_dims(m: CoreModule, value: Value) -> set[int]:
    """Dimensions some use of the value already slices."""
    return {d for _, ctx in _use_contexts(m, value) for _, d in ctx}


def tile_value(m: CoreModule, value: Value, dim: int, axis: str, *, label: str,
               tactic: str | None = None, loc: Location | None = None,
               pad: bool = False) -> list[int]:
    """Apply tile<value, dim, axis>; returns the uids of the ops to propagate from.

    A dimension the axis does not divide is an IndivisibleDimensionError unless `pad`:
    then it is padded at its end to the next multiple of the axis size (each tile holds
    ceil(size / n) positions, those past the end hold arbitrary values). On a dimension
    earlier axes divided, it is each of their tiles that is padded (12 on axes of 2 then
    4: tiles of 6, each padded to 8 and split into 4 of 2), as the loop nest slices it."""
    dim = _checked_dim(value.type, dim, label, tactic, loc)
    axes = _parts(m, axis, tactic, loc)
    n = math.prod(m.mesh[a] for a in axes)
    _claim(m, value, axes, f"tiled on dimension {dim}", label, tactic, loc)
    seeds: list[int] = []
    for (source, ctx), (uses, outputs) in _use_contexts(m, value).items():
        if any(a in axes for a, _ in ctx):
            continue  # this use is already sliced on the axis by earlier propagation
        size = local_dim_size(m, value, dim, ctx)
        if size % n and not pad:
            where = f" (already divided by {', '.join(a for a, d in ctx if d == dim)})" \
                if size != value.type.shape[dim] else ""
            raise IndivisibleDimensionError(
                f"cannot tile {label} dimension {dim} of size {size}{where} on axis "
                f"{axis!r} of size {n}: {n} does not divide {size}, and the tactic has "
                f"pad=False (pad=True would pad it to {padded_size(size, n)})",
                tactic=tactic, loc=loc)
        nest = (*_context_loops(ctx), *(Loop(a, (Tile(dim),), (dim,)) for a in axes))
        op = m.insert_identity(TILE, source, nest, uses, outputs, _loc_of(m, value))
        seeds += [op.uid, *(uid for uid, _ in uses)]
    producer = m.producer.get(value)
    if producer is not None:  # backward propagation starts at the value's definition
        seeds.append(producer[0])
    return seeds


def atomic_value(m: CoreModule, value: Value, axis: str, *, label: str,
                 tactic: str | None = None, loc: Location | None = None,
                 barrier: bool = False) -> list[int]:
    """Apply atomic<value, axis>: keep the value replicated on the axis; or, with
    `barrier`, barrier<value, axis>: keep it whole there, its readers free to slice it."""
    axes = _parts(m, axis, tactic, loc)
    _claim(m, value, axes, "a propagation barrier" if barrier else "kept replicated", label,
           tactic, loc)
    action = AnyAction(barrier=True) if barrier else ANY
    seeds: list[int] = []
    for (source, ctx), (uses, outputs) in _use_contexts(m, value).items():
        if any(a in axes for a, _ in ctx) or not (uses or outputs):
            continue  # (a value nothing reads is replicated unless tiled)
        nest = (*_context_loops(ctx), *(Loop(a, (action,), (None,)) for a in axes))
        op = m.insert_identity(ATOMIC, source, nest, uses, outputs, _loc_of(m, value))
        seeds += [op.uid, *(uid for uid, _ in uses)]
    return seeds


def _checked_dim(t: TensorType, dim: int, label: str, tactic: str | None,
                 loc: Location | None) -> int:
    """The dimension a tactic names, made non-negative; out of range is an error."""
    rank = t.rank
    if not -rank <= dim < rank:
        raise DimensionOutOfRangeError(
            f"{label} has {rank} dimension{'s' if rank != 1 else ''} "
            f"(shape {list(t.shape)}); dimension {dim} is out of range",
            tactic=tactic, loc=loc)
    return dim % rank


def _parts(m: CoreModule, axis: str, tactic: str | None = None,
           loc: Location | None = None) -> tuple[str, ...]:
    """The mesh axes the user's axis is: itself, or the sub-axes propagation split it
    into, major to minor (acting on each in turn is acting on the axis). A sub-axis the
    user names (`x:(1)2`) splits its axis first, or the sub-axes an earlier split made
    where its ends fall inside them (`x:(2)4` after `x:(4)2` on an axis of 8 splits
    `x:(1)4` into `x:(1)2`, `x:(2)2`)."""
    parts = m.mesh.parts(axis)
    if parts is None:
        splits = m.mesh.split_for(axis)
        if splits is None:  # raises the error that names the mesh's axes, or the overlap
            m.mesh.check_axis(axis, tactic=tactic, loc=loc, splits=m.splits)
        for split in splits:
            m.refine_axis(*split, f"as {f'tactic {tactic}' if tactic else 'a tactic'} "
                                  f"names {axis!r}")
        parts = m.mesh.parts(axis)
    return parts


def _claim(m: CoreModule, value: Value, axes: tuple[str, ...], what: str, label: str,
           tactic: str | None, loc: Location | None) -> None:
    for axis in axes:
        previous = m.acted.get((value, axis))
        if previous is not None:
            raise AlreadyTiledError(
                f"{label} is already {previous} on axis {m.mesh.coalesce([axis])[0]!r}; a "
                f"value can be tiled, kept replicated or made a barrier only once per axis",
                tactic=tactic, loc=loc)
    for axis in axes:
        m.acted[(value, axis)] = f"{what} by tactic {tactic}" if tactic else what


def _loc_of(m: CoreModule, value: Value) -> Location:
    p = m.producer.get(value)
    return m.by_uid[p[0]].loc if p else Location("<input>", 0)
