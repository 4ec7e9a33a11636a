"""Collective fusion passes on PartIR:HLO (paper, section 6; DESIGN.md section 5).

Each pass is a function from a Function to a Function. It never mutates its input: it
returns the very same Function when it has nothing to rewrite, and otherwise a new one
(ops it did not touch are shared). `optimize` runs them in a fixed order until none
applies, then orders the ops by demand.

The rewrites rest on these identities, per dimension, with axes major to minor and `++`
concatenating axis sequences:
- all_slice(S2) . all_slice(S1) = all_slice(S1 ++ S2): a later slice splits each chunk
  again, so its axes are minor; dually all_gather(G2) . all_gather(G1) = all_gather(G2 ++
  G1), and all_reduce(R2) . all_reduce(R1) = all_reduce(R1 u R2) for one monoid;
- all_slice(G) . all_gather(G) = id: each device picks back its own chunk. Hence, with C
  the common prefix of G and S, all_slice(C ++ S') . all_gather(C ++ G') =
  all_slice(S') . all_gather(G');
- all_slice({s: A}) . all_gather({c: A}) = all_to_all(s, c, A) for dimensions s != c;
- a device's tile cut out of pieces of all_gather({d: A}(x)) along d, when every device's
  tile is made of the same pieces of the chunks of the devices at the same distances
  along A (a roll, a shift: `jnp.roll` of a dimension sliced on A) = those pieces of x,
  each moved by one collective_permute over A;
- all_slice(S) . all_reduce(R) = reduce_scatter(S) when S names only axes of R; a slice
  over axes outside R commutes with the reduction (the devices reduced together slice
  alike), so it can go first and shrink what is reduced; so does a slice of a
  reduce_scatter on other dimensions;
- all_reduce(a) + all_reduce(b) = all_reduce(a + b) for the reduction's own monoid, and
  likewise for reduce_scatter (XLA's AllReduceReassociate): gradients a weight receives
  from two uses (a tied embedding) are reduced once;
- all_reduce(y) of a scan's stacked result y = the scan summing each slice of y in its
  body where it makes it (the sum is elementwise): a scan over layers then reduces each
  layer's gradient as the layer's backward makes it, as the unrolled model does;
- the other way round for a carried accumulator: c + all_reduce(x_i), iteration after
  iteration, = all_reduce of each device's c + x_i after the loop (the sum starting from
  zeros), and likewise for the idempotent monoids from c itself: gradient accumulation
  reduces once; and a stacked result whose slices the body all-reduces, added to other
  reductions, is the all_reduce of the stacked parts after the loop, which the sum's
  reductions then share (a pipeline's gradients over its steps).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain, pairwise
from typing import Any

import jax
import numpy as np
from jax import lax

import partir.cancel as cancel
from partir.hlo.ops import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_SLICE,
    AXIS_INDEX,
    COLLECTIVE_PERMUTE,
    COLLECTIVES,
    REDUCE_SCATTER,
    AxesPerDim,
    axes_size,
    flat_axes,
    make_all_gather,
    make_all_reduce,
    make_all_slice,
    make_all_to_all,
    make_collective_permute,
    make_padding,
    make_reduce_scatter,
    make_zeros,
    sliced_type,
)
from partir.ir import Function, Op, Region, Value
from partir.ir.collectives import chunk_coordinates
from partir.ir.evaluate import evaluate
from partir.ir.monoids import BY_ELEMENTWISE
from partir.ir.opnames import CONSTANT
from partir.mesh import split_axis_name
from partir.rules.catalogue import DataFlow, Edge, data_flow


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def _common_prefixes(axes: Sequence[AxesPerDim]) -> AxesPerDim:
    """Per dimension, the longest prefix that every entry of `axes` shares."""
    out = []
    for per_dim in zip(*axes, strict=True):
        first = per_dim[0]
        k = len(first)
        for other in per_dim:
            if k == 0:
                break
            if other != first:  # an equal entry shares all of `first`
                k = min(k, _common_prefix(first, other))
        out.append(first[:k])
    return tuple(out)


def _drop(axes: AxesPerDim, prefix: AxesPerDim) -> AxesPerDim:
    return tuple([a[len(p):] for a, p in zip(axes, prefix, strict=True)])


def _concat(a: AxesPerDim, b: AxesPerDim) -> AxesPerDim:
    return tuple([x + y for x, y in zip(a, b, strict=True)])


class _Rewriter:
    """One sweep over a function's ops, in order. Each op is seen with its operands
    already replaced by what earlier rewrites made of them, so a pattern matches the
    current program: a gather merged earlier in the sweep can be cancelled by a slice
    later in it. The producer of every value and the number of live uses are kept up to
    date, and an op whose last use is rewritten away dies at once (and so may its
    operands' producers), so that single-use conditions hold for the program as it is
    now, not as it was when the sweep began."""

    def __init__(self, fn: Function, patterns: Sequence[Pattern] = (),
                 count_uses: bool = True) -> None:
        self.fn = fn
        self.mesh = fn.attributes["mesh"]
        self.rewrites: dict[str, list[Rewrite]] = {}
        for pattern in patterns:
            for name in pattern.op_names:
                self.rewrites.setdefault(name, []).append(pattern.rewrite)
        self.sub: dict[Value, Value] = {}
        self.out: list[Op] = []
        self.dead: set[Op] = set()
        self.seen: dict[tuple, Op] = {}  # kept HLO ops by kind, operands and parameters
        self.producer: dict[Value, Op] = {}
        self._readers: dict[Value, list[Op]] | None = None  # built when first asked
        self.uses: Counter = Counter()
        if count_uses:  # a pass that never reads the counts need not take them
            self.uses.update(chain.from_iterable([op.operands for op in fn.ops]))
            self.uses.update(fn.results)

    def value(self, v: Value) -> Value:
        return self.sub.get(v, v)

    def readers(self, v: Value) -> list[Op]:
        """The ops of the function being swept that read v (as the sweep began)."""
        if self._readers is None:
            self._readers = {}
            for op in self.fn.ops:
                for u in op.operands:
                    self._readers.setdefault(u, []).append(op)
        return self._readers.get(v, [])

    def source(self, v: Value, name: str, single_use: bool = False) -> Op | None:
        """The live op named `name` that defines v (None for an argument or another
        kind), and with `single_use` only if v has no other use."""
        op = self.producer.get(v)
        if op is None or op.name != name or op in self.dead:
            return None
        if single_use and self.uses[v] != 1:
            return None
        return op

    def emit(self, op: Op) -> Value:
        """Add an op a rewrite made, itself rewritten first if a pattern matches it (a
        merged slice may cancel a gather), and return the value standing for its
        result."""
        uses = self.uses
        for v in op.operands:  # Counter.update costs more for a few items
            uses[v] += 1
        new = self.rewrite(op)
        if new is None:
            self.append(op)
            return op.results[0]
        return new

    def rewrite(self, op: Op) -> Value | None:
        """The first pattern for op's kind that rewrites it, with op then dropped."""
        for rewrite in self.rewrites.get(op.name, ()):
            new = rewrite(self, op)
            if new is not None:
                self.substitute(op, new)
                return new
        return None

    def append(self, op: Op) -> None:
        self.out.append(op)
        producer = self.producer
        for r in op.results:
            producer[r] = op

    def current(self, op: Op) -> Op:
        """`op` reading the replacements of its operands."""
        sub = self.sub
        if sub and not sub.keys().isdisjoint(op.operands):
            # What dataclasses.replace would build, without its per-field introspection.
            return Op(op.name, [sub.get(v, v) for v in op.operands], op.results, op.params,
                      op.regions, op.loc, op.prim)
        return op

    def substitute(self, op: Op, new: Value) -> None:
        """`op` (already current) is dropped: its single result becomes `new`, computed
        by ops emitted before this call."""
        old = op.results[0]
        self.sub[old] = new
        self.uses[new] += self.uses.pop(old, 0)
        self._release(op.operands)

    def _release(self, operands: Sequence[Value]) -> None:
        """One use fewer of each operand; producers left without uses die."""
        stack = list(operands)
        uses, producer, dead = self.uses, self.producer, self.dead
        while stack:
            v = stack.pop()
            uses[v] -= 1
            if uses[v]:
                continue
            op = producer.get(v)
            if op is not None and op not in dead and not any(uses[r] for r in op.results):
                dead.add(op)
                stack.extend(op.operands)

    def function(self, args: list[Value] | None = None, **attributes: object) -> Function:
        dead = self.dead
        ops = [op for op in self.out if op not in dead] if dead else self.out
        return replace(self.fn, args=self.fn.args if args is None else args, ops=ops,
                       results=[self.value(v) for v in self.fn.results],
                       attributes={**self.fn.attributes, **attributes})


# A rewrite looks at one (current) op and returns the value replacing its single result,
# having emitted the ops computing it, or None to leave the op to the next rewrite.
Rewrite = Callable[["_Rewriter", Op], Value | None]


@dataclass(frozen=True)
class Pattern:
    """A rewrite and the kinds of op it looks at."""

    op_names: tuple[str, ...]
    rewrite: Rewrite


def _sweep(fn: Function, patterns: Sequence[Pattern], count_uses: bool = True) -> Function:
    rw = _Rewriter(fn, patterns, count_uses)
    kinds = rw.rewrites
    changed = False
    # `current` and `append` inlined: this loop runs once per op per sweep.
    sub, out, producer, rewrite = rw.sub, rw.out, rw.producer, rw.rewrite
    cancel.checkpoint()
    for op in fn.ops:
        if sub and not sub.keys().isdisjoint(op.operands):
            op = rw.current(op)
        if op.name in kinds and rewrite(op) is not None:
            changed = True
        else:
            out.append(op)
            for r in op.results:
                producer[r] = op
    return rw.function() if changed else fn


# --- passes ---------------------------------------------------------------------------------


def _merge(rw: _Rewriter, op: Op) -> Value | None:
    x = op.operands[0] if op.operands else None
    if op.name == ALL_SLICE:
        # Slicing is local, so merging never adds work even when the inner slice stays.
        inner = rw.source(x, ALL_SLICE)
        if inner:
            axes = _concat(inner.params["axes"], op.params["axes"])
            return rw.emit(make_all_slice(inner.operands[0], axes, rw.mesh,
                                          op.results[0].name, op.loc))
    elif op.name == ALL_GATHER:
        inner = rw.source(x, ALL_GATHER, single_use=True)
        if inner:
            axes = _concat(op.params["axes"], inner.params["axes"])
            return rw.emit(make_all_gather(inner.operands[0], axes, rw.mesh,
                                           op.results[0].name, op.loc))
    elif op.name == ALL_REDUCE:
        inner = rw.source(x, ALL_REDUCE, single_use=True)
        if inner and inner.params["monoid"] == op.params["monoid"]:
            named = set(inner.params["axes"]) | set(op.params["axes"])
            axes = tuple(a for a in rw.mesh if a in named)
            return rw.emit(make_all_reduce(inner.operands[0], axes,
                                           op.params["monoid"], op.results[0].name, op.loc))
    return None


_MERGE = Pattern((ALL_SLICE, ALL_GATHER, ALL_REDUCE), _merge)


def merge_collectives(fn: Function) -> Function:
    """One collective for a chain of two of the same kind: all_slice(all_slice(x)),
    all_gather(all_gather(x)) and all_reduce(all_reduce(x)) of one monoid. Gathers and
    reductions merge only when the inner one has no other use, lest it be done twice."""
    return _sweep(fn, (_MERGE,))


def _repadded_gather(rw: _Rewriter, v: Value) -> Op | None:
    """The all_gather of pad(slice(all_gather(x))) where the slice cuts a padded
    dimension back to its size and the pad restores the gathered shape: the same tiles
    (with other values in the padding, which no one reads: reductions mask it)."""
    pad = rw.source(v, "pad")
    if pad is None or not _is_end_padding(pad):
        return None
    cut = rw.source(pad.operands[0], "slice")
    if cut is None or any(cut.params["start_indices"]) or \
            any(s != 1 for s in cut.params.get("strides") or ()):
        return None
    gather = rw.source(cut.operands[0], ALL_GATHER)
    if gather is None or gather.results[0].type != v.type:
        return None
    return gather


def _cancel(rw: _Rewriter, op: Op) -> Value | None:
    if op.name != ALL_SLICE:
        return None
    gather = rw.source(op.operands[0], ALL_GATHER) or _repadded_gather(rw, op.operands[0])
    if gather is None:
        return None
    g, s = gather.params["axes"], op.params["axes"]
    common = _common_prefixes([g, s])
    if not any(common):
        return None
    g, s = _drop(g, common), _drop(s, common)
    x = gather.operands[0]
    name = op.results[0].name
    if any(g):
        if rw.uses[op.operands[0]] != 1:
            return None  # the full gather stays for its other uses: a smaller one is extra
        x = rw.emit(make_all_gather(x, g, rw.mesh, name, op.loc))
    if any(s):
        x = rw.emit(make_all_slice(x, s, rw.mesh, name, op.loc))
    return x


_CANCEL = Pattern((ALL_SLICE,), _cancel)


def cancel_gather_slice(fn: Function) -> Function:
    """all_slice(all_gather(x)) -> x where the axes agree; where only leading axes agree,
    a smaller gather and slice of the other axes (then only if nothing else uses the
    gather). A padded dimension cut back to its size and padded again between the two
    (`pad(slice(all_gather(x)))`) is seen through."""
    return _sweep(fn, (_CANCEL,))


def _all_to_all(rw: _Rewriter, op: Op) -> Value | None:
    if op.name != ALL_SLICE:
        return None
    gather = rw.source(op.operands[0], ALL_GATHER, single_use=True)
    if gather is None:
        return None
    g, s = gather.params["axes"], op.params["axes"]
    gathered = [d for d, a in enumerate(g) if a]
    sliced = [d for d, a in enumerate(s) if a]
    if len(gathered) != 1 or len(sliced) != 1 or gathered == sliced:
        return None
    (c,), (d,) = gathered, sliced
    # The axes gathered last from c (its minor ones) and sliced first into d (major).
    k = max((k for k in range(1, min(len(g[c]), len(s[d])) + 1) if g[c][-k:] == s[d][:k]),
            default=0)
    if not k:
        return None
    name = op.results[0].name
    x = rw.emit(make_all_to_all(gather.operands[0], d, c, s[d][:k], rw.mesh, name,
                                op.loc))
    rank = len(g)
    if len(g[c]) > k:
        rest = tuple(g[c][:-k] if i == c else () for i in range(rank))
        x = rw.emit(make_all_gather(x, rest, rw.mesh, name, op.loc))
    if len(s[d]) > k:
        rest = tuple(s[d][k:] if i == d else () for i in range(rank))
        x = rw.emit(make_all_slice(x, rest, rw.mesh, name, op.loc))
    return x


_ALL_TO_ALL = Pattern((ALL_SLICE,), _all_to_all)


def fuse_all_to_all(fn: Function) -> Function:
    """all_slice on one dimension of all_gather on another over the same axes ->
    all_to_all. The gather must have no other use."""
    return _sweep(fn, (_ALL_TO_ALL,))


# Where the rows of a value along one dimension come from: intervals (start in the value,
# length, start in the gathered operand, or None where the rows are zeros).
_Rows = list[tuple[int, int, int | None]]


# The integer arithmetic of tile offsets, folded with NumPy: evaluated eagerly, each
# primitive is compiled by XLA the first time (tens of milliseconds in a fresh process).
_INTEGER_ARITHMETIC = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                       "max": np.maximum, "min": np.minimum, "neg": np.negative}


def _scalar_per_device(rw: _Rewriter, v: Value, axes: Sequence[str]) -> list[Any] | None:
    """v, a scalar computed from constants and the device's coordinates on `axes` alone,
    evaluated on each device of a group of `axes` (by chunk index); None if v depends on
    anything else."""
    order: list[Op] = []  # the ops computing v, each after those it reads
    seen: set[Op] = set()
    stack: list[tuple[Op, bool]] = []
    op = rw.producer.get(v)
    if op is None:
        return None
    stack.append((op, False))
    while stack:
        op, ready = stack.pop()
        if ready:
            order.append(op)
            continue
        if op in seen:
            continue
        if op.regions or op.results[0].type.shape != () or (
                op.name == AXIS_INDEX and op.params["axis"] not in axes):
            return None
        seen.add(op)
        stack.append((op, True))
        for u in op.operands:
            producer = rw.producer.get(u)
            if producer is None:
                return None  # an argument
            stack.append((producer, False))
    values = []
    # (a partitioned function called under an outer jax.jit is lowered in its trace)
    with jax.ensure_compile_time_eval():
        for chunk in range(axes_size(axes, rw.mesh)):
            coords = chunk_coordinates(chunk, axes, rw.mesh)
            env: dict[Value, Any] = {}
            for op in order:
                operands = [env[u] for u in op.operands]
                if op.name == AXIS_INDEX:
                    outs = [coords[op.params["axis"]]]
                elif op.name == CONSTANT:
                    outs = [np.asarray(op.params["value"])]
                elif op.name in _INTEGER_ARITHMETIC and all(
                        np.issubdtype(np.asarray(x).dtype, np.integer) for x in operands):
                    outs = [_INTEGER_ARITHMETIC[op.name](*operands).astype(
                        op.results[0].type.dtype)]
                else:
                    outs = evaluate(op, operands)
                env.update(zip(op.results, outs, strict=True))
            values.append(np.asarray(env[v]))
    return values


def _whole_elsewhere(op: Op, operand: int, d: int) -> bool:
    """The op leaves every dimension of the operand but d whole."""
    return all(n == m for e, (n, m) in enumerate(zip(op.operands[operand].type.shape,
                                                     op.results[0].type.shape, strict=True))
               if e != d)


def _clip(rows: _Rows, start: int, stop: int, shift: int) -> _Rows:
    """The intervals of `rows` within [start, stop), moved by `shift`."""
    out = []
    for at, n, src in rows:
        lo, hi = max(at, start), min(at + n, stop)
        if lo < hi:
            out.append((lo + shift, hi - lo, None if src is None else src + lo - at))
    return out


def _rows(rw: _Rewriter, v: Value, gathered: Value, d: int) -> _Rows | None:
    """Where v's rows along d come from, for v made of the gathered value (and zeros) by
    slices, zero pads, concatenations and splits along d (whole along the others); None
    for any other value."""
    if v is gathered:
        return [(0, v.type.shape[d], 0)]
    if _is_zeros(rw.source, v):
        return [(0, v.type.shape[d], None)]
    op = rw.producer.get(v)
    if op is None or op in rw.dead:
        return None
    name, p = op.name, op.params
    if name == "slice" and not any(s != 1 for s in p["strides"] or ()) and all(
            (p["start_indices"][e], p["limit_indices"][e]) == (0, n)
            for e, n in enumerate(op.operands[0].type.shape) if e != d):
        inner = _rows(rw, op.operands[0], gathered, d)
        start = p["start_indices"][d]
        return None if inner is None else _clip(inner, start, p["limit_indices"][d], -start)
    if name == "pad" and _whole_elsewhere(op, 0, d):
        lo, hi, interior = p["padding_config"][d]
        inner = None if interior else _rows(rw, op.operands[0], gathered, d)
        zero = None if inner is None else _scalar_per_device(rw, op.operands[1], ())
        if zero is None or zero[0] != 0:
            return None
        n = v.type.shape[d]
        moved = _clip(inner, max(0, -lo), op.operands[0].type.shape[d] - max(0, -hi), lo)
        return [*([(0, lo, None)] if lo > 0 else []), *moved,
                *([(n - hi, hi, None)] if hi > 0 else [])]
    if name == "concatenate" and p["dimension"] == d:
        out, at = [], 0
        for u in op.operands:
            inner = _rows(rw, u, gathered, d)
            if inner is None:
                return None
            out += _clip(inner, 0, u.type.shape[d], at)
            at += u.type.shape[d]
        return out
    if name == "split" and p["axis"] == d:
        k = op.results.index(v)
        start = sum(p["sizes"][:k])
        inner = _rows(rw, op.operands[0], gathered, d)
        return None if inner is None else _clip(inner, start, start + p["sizes"][k], -start)
    return None


def _cut(op: Op) -> tuple[int, int, Value] | None:
    """What a device's tile along one dimension is cut out of, at an offset computed from
    its coordinates (a dynamic_slice) or its chunk index (an all_slice): (the dimension,
    the tile's size, the value cut)."""
    if op.name == "dynamic_slice":
        sizes, whole = op.params["slice_sizes"], op.operands[0].type.shape
        cut = [d for d, (n, m) in enumerate(zip(sizes, whole, strict=True)) if n != m]
    else:
        sizes = op.results[0].type.shape
        cut = [d for d, axes in enumerate(op.params["axes"]) if axes]
    # (a dynamic_slice's start along a whole dimension is clamped to 0)
    return (cut[0], sizes[cut[0]], op.operands[0]) if len(cut) == 1 else None


def _gathered_source(rw: _Rewriter, v: Value) -> Op | None:
    """The all_gather v is made of by slices, pads, concatenations and splits."""
    stack, seen = [v], set()
    while stack:
        op = rw.producer.get(stack.pop())
        if op is None or op in seen:
            continue
        if op.name == ALL_GATHER:
            return op
        if op.name in ("slice", "pad", "concatenate", "split"):
            seen.add(op)
            stack.extend(op.operands[:1] if op.name == "pad" else op.operands)
    return None


def _read_only_by_tiles(rw: _Rewriter, gathered: Value, d: int, axes: tuple[str, ...]
                        ) -> bool:
    """Whether every use of the gathered value ends, through slices, pads, concatenations
    and splits, in a device's tile along d over the gather's axes: once they all move
    pieces instead, the gather is gone."""
    stack, seen = [gathered], set()
    while stack:
        for op in rw.readers(stack.pop()):
            if op in seen:
                continue
            seen.add(op)
            if op.name == ALL_SLICE:
                if op.params["axes"][d] != axes or any(
                        a for e, a in enumerate(op.params["axes"]) if e != d):
                    return False
            elif op.name == "dynamic_slice":
                if not _whole_elsewhere(op, 0, d):
                    return False
            elif op.name in ("slice", "pad", "concatenate", "split"):
                stack.extend(op.results)
            else:
                return False
    return True


def _shifted_tiles(rw: _Rewriter, op: Op) -> Value | None:
    """Each device's tile along d (an all_slice over the gather's axes, or a dynamic_slice
    at an offset computed from the device's coordinates on them) of a value made of
    all_gather({d: A}(x)) by slices, zero pads, concatenations and splits along d, where
    every device's tile is the same pieces of the chunks of the devices at the same
    distances along A, or zeros: those pieces of x, each moved by one collective_permute
    (a device given zeros receives nothing). Every use of the gather must end in such
    tiles."""
    cut = _cut(op)
    if cut is None:
        return None
    d, size, whole = cut
    gather = _gathered_source(rw, whole)
    if gather is None:
        return None
    axes = gather.params["axes"][d]
    gathered = gather.results[0]
    if not axes or any(a for e, a in enumerate(gather.params["axes"]) if e != d):
        return None
    if op.name == ALL_SLICE and op.params["axes"][d] != axes:
        return None
    x = gather.operands[0]
    chunk, n = x.type.shape[d], axes_size(axes, rw.mesh)
    rows = _rows(rw, whole, gathered, d)
    if size != chunk or rows is None or not _read_only_by_tiles(rw, gathered, d, axes):
        return None
    if op.name == ALL_SLICE:
        starts = [c * size for c in range(n)]
    else:
        computed = _scalar_per_device(rw, op.operands[1 + d], axes)
        if computed is None:
            return None
        # as dynamic_slice clamps its start
        starts = [min(max(int(s), 0), whole.type.shape[d] - size) for s in computed]
    layouts = []  # per device: (offset in its tile, source chunk or None for zeros, row)
    for start in starts:
        pieces: list[tuple[int, int | None, int]] = []
        for at, length, src in _clip(rows, start, start + size, -start):
            while length:
                owner, row = (None, 0) if src is None else divmod(src, chunk)
                pieces.append((at, owner, row))
                take = length if src is None else min(length, chunk - row)
                at, length = at + take, length - take
                src = None if src is None else src + take
        layouts.append(pieces)
    # The tile's pieces: where any device's source changes. Each is read from one row of
    # the chunks by every device reading it (or zeros, by no device).
    bounds = sorted({at for layout in layouts for at, _, _ in layout} | {size})
    segments = []  # (row, length, per device the chunk it reads the piece from)
    for begin_at, end_at in pairwise(bounds):
        sources, rows = [], set()
        for layout in layouts:
            at, owner, row = next(p for p in reversed(layout) if p[0] <= begin_at)
            sources.append(owner)
            if owner is not None:
                rows.add(row + begin_at - at)
        given = [c for c in sources if c is not None]
        if len(rows) > 1 or len(set(given)) != len(given):
            return None  # other rows, or one chunk to several devices: not a permutation
        segments.append((rows.pop() if rows else None, end_at - begin_at, sources))
    rank, name = x.type.rank, op.results[0].name
    parts = []
    for row, length, sources in segments:
        shape = tuple(length if e == d else m for e, m in enumerate(x.type.shape))
        if row is None:  # zeros on every device
            *_, zeros = [rw.emit(z) for z in make_zeros(x.type.with_shape(shape), op.loc)]
            parts.append(zeros)
            continue
        part = x
        if length != chunk:
            begin, end = [0] * rank, list(x.type.shape)
            begin[d], end[d] = row, row + length
            part = rw.emit(Op("slice", [x], [Value(x.type.with_shape(shape))],
                              {"start_indices": tuple(begin), "limit_indices": tuple(end),
                               "strides": None}, loc=op.loc, prim=lax.slice_p))
        if sources != list(range(n)):
            part = rw.emit(make_collective_permute(
                part, axes, [(s, c) for c, s in enumerate(sources) if s is not None],
                name, op.loc))
        parts.append(part)
    if len(parts) == 1:
        return parts[0]
    return rw.emit(Op("concatenate", parts, [Value(op.results[0].type, name)],
                      {"dimension": d}, loc=op.loc, prim=lax.concatenate_p))


def _same(rw: _Rewriter, u: Value, v: Value) -> bool:
    """u and v are one value, or the same slice of one value (the pieces a rewrite cut
    twice)."""
    if u is v:
        return True
    a, b = rw.source(u, "slice"), rw.source(v, "slice")
    return a is not None and b is not None and a.operands[0] is b.operands[0] and \
        a.params == b.params


def _merged_permutes(rw: _Rewriter, op: Op) -> Value | None:
    """permute(x, P) + permute(x, Q) = permute(x, P u Q) where no device is targeted by
    both: each sends zeros where it targets nothing (the transpose of a roll is such a
    sum)."""
    if len(op.operands) != 2:
        return None
    a, b = (rw.source(v, COLLECTIVE_PERMUTE, single_use=True) for v in op.operands)
    if a is None or b is None or not _same(rw, a.operands[0], b.operands[0]) or \
            a.params["axes"] != b.params["axes"]:
        return None
    pairs = (*a.params["pairs"], *b.params["pairs"])
    if len({t for _, t in pairs}) != len(pairs):
        return None
    return rw.emit(make_collective_permute(a.operands[0], a.params["axes"], pairs,
                                           op.results[0].name, op.loc))


def _constant_of(source: Callable[[Value, str], Op | None], v: Value, scalar: bool = True
                 ) -> Op | None:
    """The constant op v broadcasts (or with `scalar`, is), by `source`
    (`_Rewriter.source` in a sweep)."""
    op = source(v, "broadcast_in_dim")
    if op is None and not scalar:
        return None
    return source(v if op is None else op.operands[0], CONSTANT)


def _is_zeros(source: Callable[[Value, str], Op | None], v: Value, scalar: bool = False
              ) -> bool:
    """Whether v is zeros broadcast (or with `scalar`, a zero constant too)."""
    zero = _constant_of(source, v, scalar)
    return zero is not None and not np.any(zero.params["value"])


def _piecewise_sum(rw: _Rewriter, op: Op) -> Value | None:
    """concat(a1, a2) + concat(b1, b2) = concat(a1 + b1, a2 + b2) where the pieces have
    the same sizes, and x + zeros = x: what the pieces of a roll's transpose need to meet
    as one permute."""
    if len(op.operands) != 2:
        return None
    u, v = op.operands
    for x, y in ((u, v), (v, u)):
        if _is_zeros(rw.source, y) and x.type == op.results[0].type:
            return x
    a, b = (rw.source(w, "concatenate", single_use=True) for w in (u, v))
    if a is None or b is None or a.params["dimension"] != b.params["dimension"] or \
            [w.type for w in a.operands] != [w.type for w in b.operands]:
        return None
    sums = [rw.emit(Op(op.name, [x, y], [Value(x.type)], op.params, loc=op.loc,
                       prim=op.prim)) for x, y in zip(a.operands, b.operands, strict=True)]
    return rw.emit(Op("concatenate", sums, [Value(op.results[0].type, op.results[0].name)],
                      a.params, loc=op.loc, prim=a.prim))


_SHIFTED_TILES = Pattern(("dynamic_slice", ALL_SLICE), _shifted_tiles)
_MERGED_PERMUTES = Pattern(("add", "add_any"), _merged_permutes)
_PIECEWISE_SUM = Pattern(("add", "add_any"), _piecewise_sum)


def permute_shifted_tiles(fn: Function) -> Function:
    """A device's tile cut out of pieces of a gathered operand, the same pieces of its
    neighbours' chunks (or zeros) on every device (a roll or shift of a sliced dimension,
    its transpose) -> collective_permutes of those pieces; the sum of two permutes of one
    value targeting different devices -> one permute."""
    return _sweep(fn, (_SHIFTED_TILES, _MERGED_PERMUTES, _PIECEWISE_SUM))


def _reduce_scatter(rw: _Rewriter, op: Op) -> Value | None:
    if op.name != ALL_SLICE:
        return None
    reduce = rw.source(op.operands[0], ALL_REDUCE, single_use=True)
    if reduce is None:
        return None
    reduced = reduce.params["axes"]
    before, scatter = [], []  # per dimension: axes outside the reduction, then inside
    for axes in op.params["axes"]:
        k = len(axes)
        while k and axes[k - 1] in reduced:
            k -= 1
        if any(a in reduced for a in axes[:k]):
            return None  # a reduced axis major to an unreduced one: no fused form
        before.append(axes[:k])
        scatter.append(axes[k:])
    name, monoid = op.results[0].name, reduce.params["monoid"]
    x = reduce.operands[0]
    if any(before):
        x = rw.emit(make_all_slice(x, before, rw.mesh, name, op.loc))
    rest = tuple(a for a in reduced if a not in flat_axes(tuple(scatter)))
    if rest:
        x = rw.emit(make_all_reduce(x, rest, monoid, name, reduce.loc))
    if any(scatter):
        x = rw.emit(make_reduce_scatter(x, scatter, rw.mesh, monoid, name, reduce.loc))
    return x


_REDUCE_SCATTER_FUSION = Pattern((ALL_SLICE,), _reduce_scatter)


def fuse_reduce_scatter(fn: Function) -> Function:
    """all_slice(all_reduce(x)) -> reduce_scatter(x) over the sliced axes that are
    reduced; sliced axes that are not reduced slice x before the reduction. The
    all_reduce must have no other use."""
    return _sweep(fn, (_REDUCE_SCATTER_FUSION,))


def _slice_first(rw: _Rewriter, op: Op) -> Value | None:
    if op.name != ALL_SLICE:
        return None
    scatter = rw.source(op.operands[0], REDUCE_SCATTER, single_use=True)
    if scatter is None:
        return None
    s, r = op.params["axes"], scatter.params["axes"]
    # Only on other dimensions than the scatter's: on the same one the slice's axes
    # would become major to the scatter's.
    if any(a and b for a, b in zip(s, r, strict=True)) or set(flat_axes(s)) & set(
            flat_axes(r)):
        return None
    x = rw.emit(make_all_slice(scatter.operands[0], s, rw.mesh, op.results[0].name, op.loc))
    return rw.emit(make_reduce_scatter(x, r, rw.mesh, scatter.params["monoid"],
                                       op.results[0].name, scatter.loc))


_SLICE_FIRST = Pattern((ALL_SLICE,), _slice_first)


def slice_before_reduce_scatter(fn: Function) -> Function:
    """all_slice(reduce_scatter(x)) -> reduce_scatter(all_slice(x)) when the slice is on
    other dimensions and over other axes than the scatter: the devices reduced together
    slice alike, so the slice commutes and shrinks what is reduced (and may cancel a
    gather that x comes from). The reduce_scatter must have no other use."""
    return _sweep(fn, (_SLICE_FIRST,))


def _reduce_before_gather(rw: _Rewriter, op: Op) -> Value | None:
    if op.name != ALL_REDUCE:
        return None
    gather = rw.source(op.operands[0], ALL_GATHER, single_use=True)
    if gather is None or not set(op.params["axes"]).isdisjoint(
            flat_axes(gather.params["axes"])):
        return None
    # A slice over the reduced axes fuses with the reduction into a reduce_scatter of
    # the gathered value, which moves less than a reduction before the gather.
    if any(r.name == ALL_SLICE and not set(op.params["axes"]).isdisjoint(
            flat_axes(r.params["axes"])) for r in rw.readers(op.results[0])):
        return None
    name = op.results[0].name
    x = rw.emit(make_all_reduce(gather.operands[0], op.params["axes"], op.params["monoid"],
                                name, op.loc))
    return rw.emit(make_all_gather(x, gather.params["axes"], rw.mesh, name, gather.loc))


_REDUCE_BEFORE_GATHER = Pattern((ALL_REDUCE,), _reduce_before_gather)


def reduce_before_gather(fn: Function) -> Function:
    """all_reduce(all_gather(x)) -> all_gather(all_reduce(x)) when the reduction is over
    other axes than the gather: the devices reduced together hold the same chunks of the
    gathered dimensions, and an elementwise reduction commutes with concatenating them.
    The reduction then moves the ungathered value, and the gather comes last, where
    `localize_results` can leave it to the caller (a Megatron weight's gradient). The
    gather must have no other use."""
    return _sweep(fn, (_REDUCE_BEFORE_GATHER,))


def _transpose_before_gather(rw: _Rewriter, op: Op) -> Value | None:
    if op.name != "transpose":
        return None
    gather = rw.source(op.operands[0], ALL_GATHER, single_use=True)
    if gather is None:
        return None
    perm, x = op.params["permutation"], gather.operands[0]
    name = op.results[0].name
    t = x.type.with_shape(tuple(x.type.shape[i] for i in perm))
    moved = rw.emit(Op(op.name, [x], [Value(t, name)], op.params, loc=op.loc, prim=op.prim))
    axes = tuple(gather.params["axes"][i] for i in perm)
    return rw.emit(make_all_gather(moved, axes, rw.mesh, name, gather.loc))


_TRANSPOSE_BEFORE_GATHER = Pattern(("transpose",), _transpose_before_gather)


def transpose_before_gather(fn: Function) -> Function:
    """transpose(all_gather(x)) -> all_gather(transpose(x)), each dimension's axes moved
    with it: the transpose moves the smaller local value, and the gather comes later,
    where a reduction over other axes or a slice may meet it (`reduce_before_gather`,
    `cancel_gather_slice`) or `localize_results` leave it to the caller. The gather must
    have no other use."""
    return _sweep(fn, (_TRANSPOSE_BEFORE_GATHER,))


# The elementwise primitives that combine two values with each monoid (add, add_any, max,
# min, and, or): see partir.ir.monoids.
_MONOID_OPS = {prim: m.name for prim, m in BY_ELEMENTWISE.items()}


def _reduction(op: Op) -> tuple:
    """What a reduction computes: its monoid and axes (the order of an all_reduce's axes
    does not matter, that of a reduce_scatter's does)."""
    axes = op.params["axes"]
    return op.params["monoid"], frozenset(axes) if op.name == ALL_REDUCE else axes


def _reassociate(rw: _Rewriter, op: Op) -> Value | None:
    monoid = _MONOID_OPS.get(op.name)
    if monoid is None or len(op.operands) != 2:
        return None
    a, b = op.operands
    for kind in (ALL_REDUCE, REDUCE_SCATTER):
        ra, rb = rw.source(a, kind, single_use=True), rw.source(b, kind, single_use=True)
        if (ra is None or rb is None or ra is rb or ra.params["monoid"] != monoid
                or _reduction(ra) != _reduction(rb)):
            continue
        x, y = ra.operands[0], rb.operands[0]
        if x.type != y.type:
            return None
        name = op.results[0].name
        combined = rw.emit(Op(op.name, [x, y], [Value(x.type, name)], dict(op.params),
                              loc=op.loc, prim=op.prim))
        return rw.emit(replace(ra, operands=[combined],
                               results=[Value(op.results[0].type, name)]))
    return _reassociate_across(rw, op, monoid)


def _reassociate_across(rw: _Rewriter, op: Op, monoid: str) -> Value | None:
    """(r + reduce(x)) + reduce(y) -> r + reduce(x + y): autodiff accumulates the partial
    cotangents of a value used several times one at a time onto a replicated one
    (add_any(add_any(r, s1), s2)), which would otherwise take a reduction each."""
    for inner_v, outer_v in (op.operands, op.operands[::-1]):
        inner = rw.producer.get(inner_v)
        if (inner is None or inner in rw.dead or rw.uses[inner_v] != 1
                or _MONOID_OPS.get(inner.name) != monoid or len(inner.operands) != 2):
            continue
        for kind in (ALL_REDUCE, REDUCE_SCATTER):
            ry = rw.source(outer_v, kind, single_use=True)
            if ry is None or ry.params["monoid"] != monoid:
                continue
            for j in (0, 1):
                rx = rw.source(inner.operands[j], kind, single_use=True)
                if (rx is None or rx is ry or _reduction(rx) != _reduction(ry)
                        or rx.operands[0].type != ry.operands[0].type):
                    continue
                x, y = rx.operands[0], ry.operands[0]
                combined = rw.emit(Op(op.name, [x, y], [Value(x.type)], dict(op.params),
                                      loc=op.loc, prim=op.prim))
                reduced = rw.emit(replace(rx, operands=[combined],
                                          results=[Value(rx.results[0].type)]))
                return rw.emit(Op(op.name, [inner.operands[1 - j], reduced],
                                  [Value(op.results[0].type, op.results[0].name)],
                                  dict(op.params), loc=op.loc, prim=op.prim))
    return None


_REASSOCIATE = Pattern(tuple(_MONOID_OPS), _reassociate)


def reassociate_reductions(fn: Function) -> Function:
    """all_reduce(a) + all_reduce(b) -> all_reduce(a + b), and the same for
    reduce_scatter and for the other monoids (max, min, and, or), when the two reductions
    are alike and have no other use."""
    return _sweep(fn, (_REASSOCIATE,))


def _cse(rw: _Rewriter, op: Op) -> Value | None:
    # Last of the rewrites: an op that reaches it is kept unless it repeats a kept one.
    if not op.name.startswith("hlo."):
        return None
    params = op.params
    # Sorted so that the key does not depend on the order the parameters were set in
    # (a single parameter needs no sort).
    items = tuple(params.items()) if len(params) < 2 else tuple(sorted(params.items()))
    key = (op.name, tuple(op.operands), items)
    first = rw.seen.get(key)
    if first is not None and first not in rw.dead:
        return first.results[0]
    rw.seen[key] = op
    return None


_CSE = Pattern((*COLLECTIVES, AXIS_INDEX), _cse)


def cse(fn: Function) -> Function:
    """One op for identical HLO ops (same kind, operands and parameters): collectives
    and axis indices are pure, and the lowering emits one per execute."""
    # Without use counts: a repeat's operands are its first's, which stays and keeps
    # using them, so dropping a repeat never leaves a producer without uses to kill.
    return _sweep(fn, (_CSE,), count_uses=False)


def _is_end_padding(op: Op) -> bool:
    # A negative high padding crops (the transpose of a pad, in gradients): no argument
    # arrives cropped.
    return op.name == "pad" and all(lo == 0 and hi >= 0 and interior == 0
                                    for lo, hi, interior in op.params["padding_config"])


def localize_padded_arguments(fn: Function) -> Function:
    """An argument used only padded at its ends for all_slices (a dimension its axes do
    not divide, padded to their multiple) becomes device-local like the others: it
    arrives padded and sliced over the leading axes the slices share, which must include
    every padded dimension's. Its unpadded shape goes into the `in_sizes` attribute (one
    entry per argument, None where not padded), for the runtime to pad the global
    argument with."""
    if not any(op.name == "pad" for op in fn.ops):  # most programs pad nothing
        return fn
    # The uses of the arguments and of the pads reading them (what is looked at below),
    # not of every value: the ops reading none are skipped with one test in C.
    users: dict[Value, list[Op]] = {a: [] for a in fn.args}
    for op in fn.ops:
        if users.keys().isdisjoint(op.operands):
            continue
        for v in op.operands:
            if v in users:
                users[v].append(op)
        if op.name == "pad":
            users[op.results[0]] = []
    results = set(fn.results)
    rw = _Rewriter(fn, count_uses=False)
    args, shardings = list(fn.args), list(fn.attributes["in_shardings"])
    sizes = list(fn.attributes.get("in_sizes") or (None,) * len(fn.args))
    constrained = fn.attributes.get("in_constraints") or (None,) * len(fn.args)
    dropped: set[Op] = set()
    narrowed: dict[Op, AxesPerDim] = {}
    for i, a in enumerate(fn.args):
        pads = users.get(a, [])
        # (an argument laid out as asked, a region's, keeps its layout)
        if (not pads or a in results or constrained[i] is not None or any(shardings[i])
                or sizes[i] is not None
                or any(not _is_end_padding(op) or op.operands[0] is not a for op in pads)
                or len({op.results[0].type for op in pads}) != 1):
            continue
        slices = [u for op in pads for u in users.get(op.results[0], [])]
        if (not slices or any(u.name != ALL_SLICE for u in slices)
                or not results.isdisjoint(op.results[0] for op in pads)):
            continue
        prefix = _common_prefixes([u.params["axes"] for u in slices])
        padded = pads[0].results[0].type
        if any(n != m and not axes for n, m, axes in zip(a.type.shape, padded.shape, prefix,
                                                           strict=True)):
            continue
        args[i] = Value(sliced_type(padded, prefix, rw.mesh), a.name)
        shardings[i], sizes[i] = prefix, a.type.shape
        for op in pads:
            rw.sub[op.results[0]] = args[i]
            dropped.add(op)
        for u in slices:
            narrowed[u] = _drop(u.params["axes"], prefix)
    if not dropped:
        return fn
    _narrow_slices(rw, fn, narrowed, dropped)
    return rw.function(args, in_shardings=tuple(shardings), in_sizes=tuple(sizes))


def _narrow_slices(rw: _Rewriter, fn: Function, narrowed: dict[Op, AxesPerDim],
                   dropped: Container[Op] = ()) -> None:
    """The ops of fn into `rw`, but `dropped`, and the all_slices in `narrowed` slicing
    only their remaining axes (none: the slice is its operand). An untouched op is kept
    as `current` makes it; no pattern reads the producers."""
    for op in fn.ops:
        if op in dropped:
            continue
        if op not in narrowed:
            rw.out.append(rw.current(op))
        elif any(narrowed[op]):
            rw.sub[op.results[0]] = rw.emit(make_all_slice(
                rw.value(op.operands[0]), narrowed[op], rw.mesh, op.results[0].name, op.loc))
        else:
            rw.sub[op.results[0]] = rw.value(op.operands[0])


def localize_arguments(fn: Function) -> Function:
    """An argument used only through all_slice becomes device-local: it arrives already
    sliced over the leading axes all its slices share (its in_sharding grows by them), and
    each slice keeps only its remaining axes."""
    fn = localize_padded_arguments(fn)
    users: dict[Value, list[Op]] = {a: [] for a in fn.args}
    arguments = users.keys()
    for op in fn.ops:
        if arguments.isdisjoint(op.operands):  # most ops: one test in C
            continue
        for v in op.operands:
            if v in users:
                users[v].append(op)
    rw = _Rewriter(fn, count_uses=False)  # no patterns: nothing reads the use counts
    args, shardings = list(fn.args), list(fn.attributes["in_shardings"])
    constrained = fn.attributes.get("in_constraints") or (None,) * len(fn.args)
    narrowed: dict[Op, AxesPerDim] = {}
    # A set: `in` on the results list would compare each argument with every result
    # (a model's parameters and optimizer state are both, by the thousand).
    results = set(fn.results)
    for i, a in enumerate(fn.args):
        uses = users[a]
        if (not uses or a in results or constrained[i] is not None
                or any(op.name != ALL_SLICE for op in uses)):
            continue  # (an argument laid out as asked keeps its layout)
        prefix = _common_prefixes([op.params["axes"] for op in uses])
        if not any(prefix):
            continue
        args[i] = Value(sliced_type(a.type, prefix, rw.mesh), a.name)
        shardings[i] = _concat(shardings[i], prefix)
        rw.sub[a] = args[i]
        for op in uses:
            narrowed[op] = _drop(op.params["axes"], prefix)
    if not narrowed:
        return fn
    _narrow_slices(rw, fn, narrowed)
    return rw.function(args, in_shardings=tuple(shardings))


def localize_results(fn: Function) -> Function:
    """A result produced by all_gather becomes device-local: the gather's operand is
    returned instead, its out_sharding grown by the gathered axes."""
    producer = {r: op for op in fn.ops for r in op.results}
    results, shardings = list(fn.results), list(fn.attributes["out_shardings"])
    sizes = list(fn.attributes.get("out_sizes") or (None,) * len(fn.results))
    constrained = fn.attributes.get("out_constraints") or (None,) * len(fn.results)
    for i, v in enumerate(fn.results):
        if constrained[i] is not None:  # laid out as asked: `constrain_results`
            continue
        op = producer.get(v)
        gather = _unpadded_gather(op, producer)
        if gather is not None and not any(shardings[i]) and sizes[i] is None:
            # A gathered dimension cut back to its size (its axes padded it): the gather's
            # operand is returned, and the runtime cuts the global result (`out_sizes`).
            results[i] = gather.operands[0]
            shardings[i] = _concat(shardings[i], gather.params["axes"])
            sizes[i] = v.type.shape
            continue
        if op is not None and op.name == ALL_GATHER:
            results[i] = op.operands[0]
            shardings[i] = _concat(shardings[i], op.params["axes"])
    if results == fn.results:
        return fn
    attributes = {**fn.attributes, "out_shardings": tuple(shardings)}
    if any(s is not None for s in sizes):
        attributes["out_sizes"] = tuple(sizes)
    return replace(fn, results=results, attributes=attributes)


def _unpadded_gather(op: Op | None, producer: Mapping[Value, Op]) -> Op | None:
    """The all_gather whose padded result `op` cuts back to the value's size (the lowering
    does so where the gathered axes padded a dimension: `_Lowering.unpad`), or None."""
    if (op is None or op.name != "slice" or any(op.params["start_indices"])
            or any(s != 1 for s in op.params.get("strides") or ())):
        return None
    gather = producer.get(op.operands[0])
    return gather if gather is not None and gather.name == ALL_GATHER else None


def constrain_results(fn: Function) -> Function:
    """A result `out_shardings` constrains (attribute `out_constraints`: per dimension,
    the axes asked) is returned with exactly that sharding. Where the all_gather that
    makes it (the lowering gathers every result) gathers the asked axes and maybe more,
    minor to them, the gather's operand is returned, gathered over those more only;
    otherwise the whole result is sliced as asked, which moves no data."""
    constraints = fn.attributes.get("out_constraints")
    if constraints is None:
        return fn
    producer = {r: op for op in fn.ops for r in op.results}
    mesh = fn.attributes["mesh"]
    ops, results = list(fn.ops), list(fn.results)
    shardings = list(fn.attributes["out_shardings"])
    for i, (v, asked) in enumerate(zip(fn.results, constraints, strict=True)):
        if asked is None or shardings[i] == asked or any(shardings[i]):
            continue  # unconstrained, or laid out already
        op = producer.get(v)
        cut = _unpadded_gather(op, producer)
        if cut is not None and cut.params["axes"] == asked:
            # a gather of padded tiles cut to the value's size: its tiles are those asked
            results[i] = cut.operands[0]
        elif op is not None and op.name == ALL_GATHER and all(
                g[:len(a)] == a for g, a in zip(op.params["axes"], asked, strict=True)):
            rest = _drop(op.params["axes"], asked)
            if any(rest):
                ops.append(make_all_gather(op.operands[0], rest, mesh, v.name, op.loc))
                results[i] = ops[-1].results[0]
            else:
                results[i] = op.operands[0]
        else:
            # sliced as the lowering's `redistribute` slices: padded where the axes do not
            # divide a dimension
            padding = make_padding(v, asked, mesh)
            ops += padding
            ops.append(make_all_slice(padding[-1].results[0] if padding else v, asked, mesh,
                                      v.name))
            results[i] = ops[-1].results[0]
        shardings[i] = asked
    if results == fn.results:
        return fn
    return replace(fn, ops=ops, results=results,
                   attributes={**fn.attributes, "out_shardings": tuple(shardings)})


def dce(fn: Function) -> Function:
    """Drop the ops none of whose results is used. Every PartIR:HLO op is pure."""
    live = set(fn.results)
    kept: list[Op] = []
    for op in reversed(fn.ops):
        if not live.isdisjoint(op.results):
            kept.append(op)
            live.update(op.operands)
    if len(kept) == len(fn.ops):
        return fn
    return replace(fn, ops=kept[::-1])


def sum_in_loop_bodies(fn: Function) -> Function:
    """A scan's stacked result whose only use is an all_reduce (of sums) is summed by the
    scan's body slice by slice instead, and the all_reduce dropped: the body's sum
    overlaps with the next iterations' work, where one sum after the scan waits for all
    of them (XLA's scheduler cannot move a collective into a loop)."""
    stacked = {op.results[e.value]: (op, e) for op in fn.ops
               if (flow := data_flow(op)) is not None for e in flow.exits if e.lead}
    if not stacked:
        return fn
    uses = Counter(chain.from_iterable([op.operands for op in fn.ops]))
    uses.update(fn.results)
    sums: dict[Op, dict[Edge, Op]] = {}  # scan -> its stacked result's exit -> all_reduce
    for op in fn.ops:
        if op.name == ALL_REDUCE and op.params["monoid"] == "add":
            made = stacked.get(op.operands[0])
            if made is not None and uses[op.operands[0]] == 1:
                sums.setdefault(made[0], {})[made[1]] = op
    if not sums:
        return fn
    dropped = {ar for ars in sums.values() for ar in ars.values()}
    ops = []
    for op in fn.ops:
        ars = sums.get(op)
        if ars is not None:
            by_result = {e.value: ar for e, ar in ars.items()}
            op = Op(op.name, op.operands, [by_result[k].results[0] if k in by_result else r
                                           for k, r in enumerate(op.results)],
                    op.params, _sum_in_regions(op.regions, ars), op.loc, op.prim)
        if op not in dropped:
            ops.append(op)
    return replace(fn, ops=ops)


def _sum_in_regions(regions: Sequence[Region], sums: Mapping[Edge, Op]) -> list[Region]:
    """A scan's body summing each stacked result of `sums` (by its exit) as that
    all_reduce did, as it makes each slice (at the line of the op making it): a sum of the
    stacked result is the stack of the slices' sums, one per iteration, as the unrolled
    loop would sum each layer's gradient where it makes it."""
    out = []
    for i, region in enumerate(regions):
        made = {r: op.loc for op in region.ops for r in op.results}
        ops, yields = list(region.ops), list(region.yields)
        for e, ar in sums.items():
            if e.region == i:
                summed = make_all_reduce(yields[e.position], ar.params["axes"],
                                         ar.params["monoid"],
                                         loc=made.get(yields[e.position], ar.loc))
                ops.append(summed)
                yields[e.position] = summed.results[0]
        out.append(Region(region.args, ops, yields))
    return out


def _moves_elements(op: Op) -> bool:
    """Whether op moves its one operand's elements without combining or changing them: a
    reduction across devices before it is the reduction after it."""
    return op.name in ("transpose", "reshape") or (
        op.name == "convert_element_type" and op.results[0].type == op.operands[0].type) or (
        # a sum over dimensions of size 1 (a bias's gradient, batched) only drops them
        op.name == "reduce_sum" and all(op.operands[0].type.shape[d] == 1
                                        for d in op.params["axes"]))


def _linear_chain(producer: Mapping[Value, Op], uses: Mapping[Value, int], v: Value,
                  masks: list[Value] | None = None) -> tuple[Value, list[Op], bool]:
    """The value v is made from through ops each linear in it (moving its elements, or
    scaling them by a constant: a mean's division), each value on the way read once: that
    value, those ops in program order, and whether one scales. Given `masks`, also
    through a select of it against zeros, whose predicate it appends there: linear where
    the predicate is the same on every device of the reduction the caller looks for (it
    checks: `_uniform`)."""
    source = _source_in(producer)
    chain_ops: list[Op] = []
    scales = False
    while (op := producer.get(v)) is not None and uses[v] == 1:
        if masks is not None and op.name == "select_n" and len(op.operands) == 3 and (
                kept := _against_zeros(source, op)) is not None:
            masks.append(op.operands[0])
            v = kept
        elif _moves_elements(op):
            v = op.operands[0]
        elif op.name in ("mul", "div") and _constant_of(source, op.operands[1]) is not None:
            v, scales = op.operands[0], True
        elif op.name == "mul" and _constant_of(source, op.operands[0]) is not None:
            v, scales = op.operands[1], True
        else:
            break
        chain_ops.append(op)
    return v, chain_ops[::-1], scales


def _against_zeros(source: Callable[[Value, str], Op | None], op: Op) -> Value | None:
    """The case a two-way select keeps where its other case is zeros, else None."""
    _, on_false, on_true = op.operands
    if _is_zeros(source, on_false, scalar=True):
        return on_true
    if _is_zeros(source, on_true, scalar=True):
        return on_false
    return None


def _uniform(v: Value, axes: Sequence[str], producer: Mapping[Value, Op],
             uniform_arg: Callable[[Value], bool]) -> bool:
    """Whether v is the same on every device of a group of mesh axes `axes`: made, by ops
    computing alike on every device, from constants, device coordinates on other axes and
    region arguments `uniform_arg` accepts (a loop's step counter)."""
    bases = {split_axis_name(a)[0] for a in axes}
    seen: set[Value] = set()
    stack = [v]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        op = producer.get(u)
        if op is None:
            if not uniform_arg(u):
                return False
        elif op.name == AXIS_INDEX:
            if split_axis_name(op.params["axis"])[0] in bases:
                return False
        elif op.regions or op.name in COLLECTIVES:
            return False
        else:
            stack.extend(op.operands)
    return True


def _source_in(producer: Mapping[Value, Op]) -> Callable[[Value, str], Op | None]:
    """`_Rewriter.source` over a map of producers."""
    def source(v: Value, name: str) -> Op | None:
        op = producer.get(v)
        return op if op is not None and op.name == name else None
    return source


@dataclass(frozen=True)
class _Accumulator:
    carry: int  # the carry's position in the op's data flow
    reduction: Op  # the all_reduce in the body each iteration combines in
    idempotent: bool  # the monoid's x . x = x: max, min, and, or
    # Where the reduction is in a loop of the body, slice by slice of its stacked result
    # (a pipeline step's stages' layers), that loop; else None.
    inner: _Stacked | None = None


def _accumulators(op: Op, flow: DataFlow, outer: Mapping[Value, Op]) -> list[_Accumulator]:
    """The carries of `op` that accumulate an all_reduce each iteration: a carry's
    argument read by that combination alone (and by no other region: a while loop's
    condition does not see it), the combination read by the yield alone, the reduction's
    result read by it alone (through ops linear in it, `_linear_chain`: a mean's division
    too, or a select against zeros by a predicate the same across the reduction's axes: a
    pipeline's steps that hold a microbatch). `outer` makes the op's operands."""
    producers = [{v: o for o in region.ops for v in o.results} for region in op.regions]
    uses = [Counter(chain.from_iterable([o.operands for o in region.ops]))
            for region in op.regions]
    for u, region in zip(uses, op.regions, strict=True):
        u.update(region.yields)
    readers = [{v: o for o in region.ops for v in o.operands} for region in op.regions]
    # A region argument is the same on every device where what enters it is.
    entering = {op.regions[e.region].args[e.position]: op.operands[e.value]
                for e in flow.entries}
    found = []
    for n, carry in enumerate(flow.carries):
        r, p = carry.made
        body_args = [op.regions[r2].args[p2] for r2, p2 in carry.args if r2 == r]
        if len(body_args) != 1 or any(uses[r2][op.regions[r2].args[p2]]
                                      for r2, p2 in carry.args if r2 != r):
            continue
        arg, made = body_args[0], op.regions[r].yields[p]
        combine = producers[r].get(made)
        monoid = _MONOID_OPS.get(combine.name) if combine is not None else None
        if monoid is None or uses[r][made] != 1 or len(combine.operands) != 2:
            continue
        # the carry reaches the combination unchanged (JAX converts a weakly typed one)
        held = arg
        while uses[r][held] == 1 and (reader := readers[r].get(held)) is not None \
                and reader.name == "convert_element_type" and _moves_elements(reader):
            held = reader.results[0]
        if uses[r][held] != 1 or held not in combine.operands:
            continue
        v = combine.operands[1] if combine.operands[0] is held else combine.operands[0]
        masks: list[Value] = []
        reduction = _reduction_behind(producers[r], uses[r], v, masks)
        inner = None
        if reduction is None:
            masks = []
            inner = _stacked_reduction(producers[r], uses[r], v, masks)
            reduction = inner.reduction if inner is not None else None
        if reduction is None or reduction.params["monoid"] != monoid or (
                masks and monoid != "add"):
            continue
        axes = reduction.params["axes"]

        def uniform_arg(a: Value, axes: Sequence[str] = axes) -> bool:
            return a in entering and _uniform(entering[a], axes, outer, lambda _: False)

        if all(_uniform(p, axes, producers[r], uniform_arg) for p in masks):
            found.append(_Accumulator(n, reduction, monoid != "add", inner))
    return found


def _reduction_behind(producer: Mapping[Value, Op], uses: Mapping[Value, int], v: Value,
                      masks: list[Value] | None = None) -> Op | None:
    """The all_reduce that makes v through ops linear in it (`_linear_chain`, `masks` as
    there; scaling only a sum: a negative scale turns a max into a min), read once; None
    if none does."""
    v, _, scales = _linear_chain(producer, uses, v, masks)
    reduction = producer.get(v)
    if reduction is None or reduction.name != ALL_REDUCE or uses[v] != 1 or (
            scales and reduction.params["monoid"] != "add"):
        return None
    return reduction


def _without(region: Region, reduction: Op) -> Region:
    """The region with `reduction` gone, what read its result reading its operand."""
    out, kept = reduction.results[0], reduction.operands[0]
    return Region(region.args, [
        replace(o, operands=[kept if v is out else v for v in o.operands])
        if out in o.operands else o for o in region.ops if o is not reduction],
        [kept if v is out else v for v in region.yields])


def _without_inside(region: Region, stacked: _Stacked) -> Region:
    """The region with the loop of `stacked` reducing its stacked result no more."""
    loop = stacked.loop
    inner = list(loop.regions)
    inner[stacked.exit.region] = _without(inner[stacked.exit.region], stacked.reduction)
    new = replace(loop, regions=inner)
    return Region(region.args, [new if o is loop else o for o in region.ops], region.yields)


def sum_after_loops(fn: Function) -> Function:
    """A loop-carried accumulator that each iteration combines with an all_reduce, and
    nothing else reads, accumulates each device's part instead, reduced once after the
    loop: the sum of the iterations' all_reduces is the all_reduce of their sum (gradient
    accumulation over microbatches under batch parallelism reduces the gradient once, not
    per microbatch). The part starts from the carry's initial value on every device where
    the monoid is idempotent (max, min, and, or) and from zeros for a sum, the initial
    value added after the reduction unless it is zeros."""
    outer = {v: o for o in fn.ops for v in o.results}
    found = {op: accs for op in fn.ops if op.regions and (flow := data_flow(op)) is not None
             and (accs := _accumulators(op, flow, outer))}
    if not found:
        return fn
    source = _source_in({v: o for o in fn.ops for v in o.results})
    sub: dict[Value, Value] = {}
    ops: list[Op] = []
    for op in fn.ops:
        accs = found.get(op)
        if sub and not sub.keys().isdisjoint(op.operands):
            op = replace(op, operands=[sub.get(v, v) for v in op.operands])
        if accs is None:
            ops.append(op)
            continue
        flow = data_flow(op)
        operands, results, regions = list(op.operands), list(op.results), list(op.regions)
        after: list[Op] = []
        for acc in accs:
            carry, ar = flow.carries[acc.carry], acc.reduction
            init = operands[carry.operand]
            from_init = acc.idempotent or _is_zeros(source, init, scalar=True)
            if not from_init:
                zeros = make_zeros(init.type, ar.loc)
                ops += zeros
                operands[carry.operand] = zeros[-1].results[0]
            r = carry.made[0]
            regions[r] = (_without(regions[r], ar) if acc.inner is None
                          else _without_inside(regions[r], acc.inner))
            result = results[carry.result]
            results[carry.result] = Value(result.type)
            reduced = make_all_reduce(results[carry.result], ar.params["axes"],
                                      ar.params["monoid"], result.name, ar.loc)
            after.append(reduced)
            if not from_init:
                after.append(Op("add", [init, reduced.results[0]],
                                [Value(result.type, result.name)], loc=ar.loc,
                                prim=lax.add_p))
            sub[result] = after[-1].results[0]
        ops.append(replace(op, operands=operands, results=results, regions=regions))
        ops += after
    return replace(fn, ops=ops, results=[sub.get(v, v) for v in fn.results])


@dataclass(frozen=True)
class _Stacked:
    """A loop's stacked result that its body makes slice by slice with an all_reduce, and
    the ops after the loop, linear in it, making the value a sum reads."""

    loop: Op
    exit: Edge
    reduction: Op  # in the loop's body
    linear: list[Op]


def _stacked_reduction(producer: Mapping[Value, Op], uses: Mapping[Value, int], v: Value,
                       masks: list[Value] | None = None) -> _Stacked | None:
    v, linear, scales = _linear_chain(producer, uses, v, masks)
    loop = producer.get(v)
    if uses[v] != 1 or loop is None or not loop.regions \
            or (flow := data_flow(loop)) is None:
        return None
    k = next(i for i, r in enumerate(loop.results) if r is v)
    exits = [e for e in flow.exits if e.value == k]
    if len(exits) != 1 or not exits[0].lead:
        return None
    region = loop.regions[exits[0].region]
    inner = {r: o for o in region.ops for r in o.results}
    inner_uses = Counter(chain.from_iterable([o.operands for o in region.ops]))
    inner_uses.update(region.yields)
    reduction = _reduction_behind(inner, inner_uses, region.yields[exits[0].position])
    if reduction is None or (scales and reduction.params["monoid"] != "add"):
        return None
    return _Stacked(loop, exits[0], reduction, linear)


def sum_stacked_results_together(fn: Function) -> Function:
    """A loop's stacked result that its body all-reduces slice by slice, added (through
    ops linear in it) into a sum with other reductions alike, is reduced after
    the loop instead, where the sum's reductions then combine into one
    (`reassociate_reductions`): each pipeline stage's weight gradients, accumulated over
    its steps, are reduced once, not once per layer and step. This never runs a reduction
    more often; where nothing combines with it, the reduction stays in the body
    (`sum_in_loop_bodies`), overlapping the next iterations."""
    if not any(op.regions for op in fn.ops):
        return fn
    producer = {v: o for o in fn.ops for v in o.results}
    uses = Counter(chain.from_iterable([op.operands for op in fn.ops]))
    uses.update(fn.results)
    readers = {v: op for op in fn.ops for v in op.operands}
    # The sums: chains of one monoid's ops, each result read by the next alone; per chain
    # (by its last op), its operands made by a reduction (an all_reduce or a stacked one)
    # by what that reduction computes.
    last: dict[Op, Op] = {}
    # per chain and reduction: (operand, its loop's reduction if a stacked one)
    leaves: dict[Op, dict[tuple, list[tuple[Value, _Stacked | None]]]] = {}
    for op in reversed(fn.ops):
        monoid = _MONOID_OPS.get(op.name)
        if monoid is None or len(op.operands) != 2:
            continue
        reader = readers.get(op.results[0])
        end = (last[reader] if uses[op.results[0]] == 1 and reader in last
               and _MONOID_OPS.get(reader.name) == monoid else op)
        last[op] = end
        for v in op.operands:
            made = producer.get(v)
            if made is not None and last.get(made) is end:
                continue  # a sum of the chain
            found = None
            if made is not None and made.name == ALL_REDUCE:
                key = _reduction(made)
            elif (found := _stacked_reduction(producer, uses, v)) is not None:
                key = _reduction(found.reduction)
            else:
                continue
            if key[0] == monoid:
                leaves.setdefault(end, {}).setdefault(key, []).append((v, found))
    stacked = {v: found for by_key in leaves.values() for made in by_key.values()
               if len(made) > 1 for v, found in made if found is not None}
    if not stacked:
        return fn
    by_loop: dict[Op, list[_Stacked]] = {}
    after: dict[Op, list[Value]] = {}  # op -> the values reduced right after it
    for u, h in stacked.items():
        by_loop.setdefault(h.loop, []).append(h)
        after.setdefault(h.linear[-1] if h.linear else h.loop, []).append(u)
    partial: dict[Value, Value] = {}  # a value now holding each device's part -> its new name
    ops: list[Op] = []
    for op in fn.ops:
        hoisted = by_loop.get(op)
        if hoisted is not None:
            regions = list(op.regions)
            for h in hoisted:
                regions[h.exit.region] = _without(regions[h.exit.region], h.reduction)
                v = op.results[h.exit.value]
                partial[v] = Value(v.type)
            new = replace(op, results=[partial.get(v, v) for v in op.results],
                          regions=regions)
        elif partial.keys().isdisjoint(op.operands):
            new = op
        else:  # an op linear in a part
            partial[op.results[0]] = Value(op.results[0].type)
            new = replace(op, operands=[partial.get(v, v) for v in op.operands],
                          results=[partial[op.results[0]]])
        ops.append(new)
        for u in after.get(op, ()):  # u is the sum's operand again, now reduced here
            ar = stacked[u].reduction
            ops.append(Op(ALL_REDUCE, [partial.pop(u)], [u], dict(ar.params), loc=ar.loc))
    return replace(fn, ops=ops)


def regather_for_backward(fn: Function) -> Function:
    """ZeRO-3: an argument all-gathered for ops of both passes of a gradient is gathered
    again for the backward pass's ops, as DeepSpeed's ZeRO-3 and FSDP do (the paper's
    "two AllGather per parameter tensor"): the gathered parameter then dies with its last
    forward use instead of living through the backward pass, which is ZeRO-3's memory
    saving (`Location.backward` says which pass an op is in)."""
    args = set(fn.args)
    gathers = {op.results[0]: op for op in fn.ops
               if op.name == ALL_GATHER and op.operands[0] in args}
    if not gathers:
        return fn
    passes: dict[Value, set[bool]] = {}  # gathered value -> the passes reading it
    for op in fn.ops:
        for v in op.operands:
            if v in gathers:
                passes.setdefault(v, set()).add(op.loc.backward)
    both = {v for v, seen in passes.items() if len(seen) == 2}
    if not both:
        return fn
    again: dict[Value, Value] = {}
    ops = []
    mesh = fn.attributes["mesh"]
    for op in fn.ops:
        if op.loc.backward and not both.isdisjoint(op.operands):
            operands = []
            for v in op.operands:
                if v in both:
                    if v not in again:
                        first = gathers[v]
                        gather = make_all_gather(first.operands[0], first.params["axes"], mesh,
                                                 v.name, op.loc)
                        ops.append(gather)
                        again[v] = gather.results[0]
                    v = again[v]
                operands.append(v)
            op = Op(op.name, operands, op.results, op.params, op.regions, op.loc, op.prim)
        ops.append(op)
    return replace(fn, ops=ops)


def schedule_by_demand(fn: Function) -> Function:
    """Order the ops depth first from the results: each op comes right before the first op
    that needs it, operands in order. A gathered parameter is then gathered just before
    its use (as in the paper's listings), not at the top of the program; XLA's own
    scheduler decides the final order anyway. Ops no result needs are dropped."""
    producer = {r: op for op in fn.ops for r in op.results}
    placed: set[Op] = set()
    order: list[Op] = []
    for root in fn.results:
        if root not in producer:
            continue
        # Iterative post-order: the stack holds (op, index of the next operand to visit).
        stack = [(producer[root], 0)]
        while stack:
            op, i = stack.pop()
            if op in placed:
                continue
            # Skip the operands with nothing left to place without a trip via the stack.
            operands = op.operands
            while i < len(operands):
                dep = producer.get(operands[i])
                i += 1
                if dep is not None and dep not in placed:
                    stack.append((op, i))
                    stack.append((dep, 0))
                    break
            else:
                placed.add(op)
                order.append(op)
    if order == fn.ops:
        return fn
    return replace(fn, ops=order)


# Every local rewrite, tried in this order on each op of one sweep. CSE comes last: an op
# it records is one that stays.
LOCAL_PATTERNS: tuple[Pattern, ...] = (
    _MERGE, _CANCEL, _REASSOCIATE, _REDUCE_SCATTER_FUSION, _SLICE_FIRST, _ALL_TO_ALL,
    _TRANSPOSE_BEFORE_GATHER, _REDUCE_BEFORE_GATHER, _SHIFTED_TILES, _MERGED_PERMUTES,
    _PIECEWISE_SUM, _CSE)


def optimize(fn: Function) -> Function:
    """The local rewrites in one sweep, then the argument and result localization,
    repeated until nothing changes (each rewrite removes a collective or moves work
    before a reduction, so this ends), then the ops ordered by demand. A sweep sees the
    rewrites made earlier in it, so a second round mostly confirms the first. Dead code
    goes only after the first round's argument localization: an input the function never
    reads is sliced by all_slices nothing uses (merged by the sweep), which say how the
    schedule lays it out."""
    while True:
        start = fn
        # dce last: the gathers localize_results bypasses die in this round, not the next
        fn = dce(constrain_results(localize_results(localize_arguments(
            _sweep(cse(sum_stacked_results_together(fn)), LOCAL_PATTERNS)))))
        if fn is start:
            # the bodies optimized first: what a loop reduces once after it is what they
            # still reduce; its reductions may then fuse with what reads them
            fn = optimize_regions(fn)
            summed = sum_after_loops(fn)
            if summed is fn:
                return schedule_by_demand(optimize_regions(regather_for_backward(
                    sum_in_loop_bodies(fn))))
            fn = summed


def optimize_regions(fn: Function) -> Function:
    """The local rewrites, to a fixed point, inside the regions of control-flow ops (inner
    regions first): a body is a device-local program like the function, so a gather
    sliced again on another dimension is an all_to_all there too, and a roll of a sliced
    dimension a permute. What crosses a region's boundary stays as it is: the op's
    operands and results keep their types."""
    ops = []
    for op in fn.ops:
        if op.regions:
            regions = [_optimize_region(r, fn.attributes["mesh"]) for r in op.regions]
            if any(new is not old for new, old in zip(regions, op.regions, strict=True)):
                op = Op(op.name, op.operands, op.results, op.params, regions, op.loc, op.prim)
        ops.append(op)
    if all(new is old for new, old in zip(ops, fn.ops, strict=True)):
        return fn
    return replace(fn, ops=ops)


def _optimize_region(region: Region, mesh: object) -> Region:
    body = start = optimize_regions(Function("region", list(region.args), list(region.ops),
                                             list(region.yields), attributes={"mesh": mesh}))
    while True:
        before = body
        body = dce(sum_after_loops(_sweep(cse(sum_stacked_results_together(body)),
                                          LOCAL_PATTERNS)))
        if body is before:
            break
    if body is start and start.ops == region.ops:
        return region
    return Region(body.args, body.ops, body.results)
