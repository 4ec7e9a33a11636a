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
- all_slice(S) . all_reduce(R) = reduce_scatter(S) when S names only axes of R; a slice
  over axes outside R commutes with the reduction (the devices reduced together slice
  alike), so it can go first and shrink what is reduced;
- all_reduce(a) + all_reduce(b) = all_reduce(a + b) for the reduction's own monoid, and
  likewise for reduce_scatter (XLA's AllReduceReassociate): gradients a weight receives
  from two uses (a tied embedding) are reduced once.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from partir.hlo.ops import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_SLICE,
    REDUCE_SCATTER,
    AxesPerDim,
    flat_axes,
    make_all_gather,
    make_all_reduce,
    make_all_slice,
    make_all_to_all,
    make_reduce_scatter,
    sliced_type,
)
from partir.ir import Function, Op, Value


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def _common_prefixes(axes: Sequence[AxesPerDim]) -> AxesPerDim:
    """Per dimension, the longest prefix that every entry of `axes` shares."""
    out = []
    for per_dim in zip(*axes, strict=True):
        k = min(_common_prefix(per_dim[0], other) for other in per_dim)
        out.append(per_dim[0][:k])
    return tuple(out)


def _drop(axes: AxesPerDim, prefix: AxesPerDim) -> AxesPerDim:
    return tuple(a[len(p):] for a, p in zip(axes, prefix, strict=True))


def _concat(a: AxesPerDim, b: AxesPerDim) -> AxesPerDim:
    return tuple(x + y for x, y in zip(a, b, strict=True))


class _Rewriter:
    """One sweep over a function's ops: patterns match the input function, replacements
    are emitted in place, and later ops read the replacements."""

    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self.mesh = fn.attributes["mesh"]
        self.sub: dict[Value, Value] = {}
        self.out: list[Op] = []

    # Built on first use: most sweeps over a large function never match a pattern.
    @functools.cached_property
    def producer(self) -> dict[Value, Op]:
        return {r: op for op in self.fn.ops for r in op.results}

    @functools.cached_property
    def uses(self) -> Counter:
        uses = Counter(v for op in self.fn.ops for v in op.operands)
        uses.update(self.fn.results)
        return uses

    def value(self, v: Value) -> Value:
        return self.sub.get(v, v)

    def source(self, v: Value, name: str, single_use: bool = False) -> Op | None:
        """The op named `name` of the input function that defines v, unless this sweep
        already replaced v (the next sweep will look again) or, with `single_use`, v has
        other uses."""
        op = self.producer.get(v)
        if op is None or op.name != name or v in self.sub:
            return None
        if single_use and self.uses[v] != 1:
            return None
        return op

    def emit(self, op: Op) -> Value:
        self.out.append(op)
        return op.results[0]

    def keep(self, op: Op) -> None:
        sub = self.sub
        if sub and any(v in sub for v in op.operands):
            op = replace(op, operands=[sub.get(v, v) for v in op.operands])
        self.out.append(op)

    def function(self, args: list[Value] | None = None, **attributes: object) -> Function:
        return replace(self.fn, args=self.fn.args if args is None else args, ops=self.out,
                       results=[self.value(v) for v in self.fn.results],
                       attributes={**self.fn.attributes, **attributes})


# A rewrite looks at one op of the input function and returns the value replacing its
# (single) result, having emitted the ops computing it, or None to keep the op.
Rewrite = Callable[[_Rewriter, Op], Value | None]


def _sweep(fn: Function, rewrite: Rewrite) -> Function:
    rw = _Rewriter(fn)
    changed = False
    for op in fn.ops:
        new = rewrite(rw, op)
        if new is None:
            rw.keep(op)
        else:
            rw.sub[op.results[0]] = new
            changed = True
    return rw.function() if changed else fn


# --- passes ---------------------------------------------------------------------------------


def _merge(rw: _Rewriter, op: Op) -> Value | None:
    x = op.operands[0] if op.operands else None
    if op.name == ALL_SLICE:
        # Slicing is local, so merging never adds work even when the inner slice stays.
        inner = rw.source(x, ALL_SLICE)
        if inner:
            axes = _concat(inner.params["axes"], op.params["axes"])
            return rw.emit(make_all_slice(rw.value(inner.operands[0]), axes, rw.mesh,
                                          op.results[0].name, op.loc))
    elif op.name == ALL_GATHER:
        inner = rw.source(x, ALL_GATHER, single_use=True)
        if inner:
            axes = _concat(op.params["axes"], inner.params["axes"])
            return rw.emit(make_all_gather(rw.value(inner.operands[0]), axes, rw.mesh,
                                           op.results[0].name, op.loc))
    elif op.name == ALL_REDUCE:
        inner = rw.source(x, ALL_REDUCE, single_use=True)
        if inner and inner.params["monoid"] == op.params["monoid"]:
            named = set(inner.params["axes"]) | set(op.params["axes"])
            axes = tuple(a for a in rw.mesh if a in named)
            return rw.emit(make_all_reduce(rw.value(inner.operands[0]), axes,
                                           op.params["monoid"], op.results[0].name, op.loc))
    return None


def merge_collectives(fn: Function) -> Function:
    """One collective for a chain of two of the same kind: all_slice(all_slice(x)),
    all_gather(all_gather(x)) and all_reduce(all_reduce(x)) of one monoid. Gathers and
    reductions merge only when the inner one has no other use, lest it be done twice."""
    return _sweep(fn, _merge)


def _cancel(rw: _Rewriter, op: Op) -> Value | None:
    if op.name != ALL_SLICE:
        return None
    gather = rw.source(op.operands[0], ALL_GATHER)
    if gather is None:
        return None
    g, s = gather.params["axes"], op.params["axes"]
    common = _common_prefixes([g, s])
    if not any(common):
        return None
    g, s = _drop(g, common), _drop(s, common)
    x = rw.value(gather.operands[0])
    name = op.results[0].name
    if any(g):
        if rw.uses[op.operands[0]] != 1:
            return None  # the full gather stays for its other uses: a smaller one is extra
        x = rw.emit(make_all_gather(x, g, rw.mesh, name, op.loc))
    if any(s):
        x = rw.emit(make_all_slice(x, s, rw.mesh, name, op.loc))
    return x


def cancel_gather_slice(fn: Function) -> Function:
    """all_slice(all_gather(x)) -> x where the axes agree; where only leading axes agree,
    a smaller gather and slice of the other axes (then only if nothing else uses the
    gather)."""
    return _sweep(fn, _cancel)


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
    x = rw.emit(make_all_to_all(rw.value(gather.operands[0]), d, c, s[d][:k], rw.mesh, name,
                                op.loc))
    rank = len(g)
    if len(g[c]) > k:
        rest = tuple(g[c][:-k] if i == c else () for i in range(rank))
        x = rw.emit(make_all_gather(x, rest, rw.mesh, name, op.loc))
    if len(s[d]) > k:
        rest = tuple(s[d][k:] if i == d else () for i in range(rank))
        x = rw.emit(make_all_slice(x, rest, rw.mesh, name, op.loc))
    return x


def fuse_all_to_all(fn: Function) -> Function:
    """all_slice on one dimension of all_gather on another over the same axes ->
    all_to_all. The gather must have no other use."""
    return _sweep(fn, _all_to_all)


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
    x = rw.value(reduce.operands[0])
    if any(before):
        x = rw.emit(make_all_slice(x, before, rw.mesh, name, op.loc))
    rest = tuple(a for a in reduced if a not in flat_axes(tuple(scatter)))
    if rest:
        x = rw.emit(make_all_reduce(x, rest, monoid, name, reduce.loc))
    if any(scatter):
        x = rw.emit(make_reduce_scatter(x, scatter, rw.mesh, monoid, name, op.loc))
    return x


def fuse_reduce_scatter(fn: Function) -> Function:
    """all_slice(all_reduce(x)) -> reduce_scatter(x) over the sliced axes that are
    reduced; sliced axes that are not reduced slice x before the reduction. The
    all_reduce must have no other use."""
    return _sweep(fn, _reduce_scatter)


# The elementwise primitives that combine two values with each monoid; `add_any` is how
# JAX's autodiff accumulates the cotangents of a value used twice.
_MONOID_OPS = {"add": "add", "add_any": "add", "max": "max", "min": "min", "and": "and",
               "or": "or"}


def _reduction(op: Op) -> tuple:
    """What a reduction computes: its monoid and axes (the order of an all_reduce's axes
    does not matter, that of a reduce_scatter's does)."""
    axes = op.params["axes"]
    return op.params["monoid"], frozenset(axes) if op.name == ALL_REDUCE else axes


def _reassociate(rw: _Rewriter, op: Op) -> Value | None:
    monoid = _MONOID_OPS.get(op.name)
    if monoid is None or "_loops" in op.params or len(op.operands) != 2:
        return None
    a, b = op.operands
    for kind in (ALL_REDUCE, REDUCE_SCATTER):
        ra, rb = rw.source(a, kind, single_use=True), rw.source(b, kind, single_use=True)
        if (ra is None or rb is None or ra is rb or ra.params["monoid"] != monoid
                or _reduction(ra) != _reduction(rb)):
            continue
        x, y = rw.value(ra.operands[0]), rw.value(rb.operands[0])
        if x.type != y.type:
            return None
        name = op.results[0].name
        combined = rw.emit(Op(op.name, [x, y], [Value(x.type, name)], dict(op.params),
                              loc=op.loc, prim=op.prim))
        return rw.emit(replace(ra, operands=[combined],
                               results=[Value(op.results[0].type, name)]))
    return None


def reassociate_reductions(fn: Function) -> Function:
    """all_reduce(a) + all_reduce(b) -> all_reduce(a + b), and the same for
    reduce_scatter and for the other monoids (max, min, and, or), when the two reductions
    are alike and have no other use."""
    return _sweep(fn, _reassociate)


def cse(fn: Function) -> Function:
    """One op for identical HLO ops (same kind, operands and parameters): collectives
    and axis indices are pure, and the lowering emits one per execute."""
    seen: dict[tuple, Value] = {}

    def rewrite(rw: _Rewriter, op: Op) -> Value | None:
        if not op.name.startswith("hlo."):
            return None
        key = (op.name, tuple(rw.value(v) for v in op.operands),
               tuple(sorted(op.params.items())))
        if key in seen:
            return seen[key]
        seen[key] = op.results[0]
        return None

    return _sweep(fn, rewrite)


def localize_arguments(fn: Function) -> Function:
    """An argument used only through all_slice becomes device-local: it arrives already
    sliced over the leading axes all its slices share (its in_sharding grows by them), and
    each slice keeps only its remaining axes."""
    users: dict[Value, list[Op]] = {a: [] for a in fn.args}
    for op in fn.ops:
        for v in op.operands:
            if v in users:
                users[v].append(op)
    rw = _Rewriter(fn)
    args, shardings = list(fn.args), list(fn.attributes["in_shardings"])
    narrowed: dict[Op, AxesPerDim] = {}
    for i, a in enumerate(fn.args):
        uses = users[a]
        if not uses or a in fn.results or any(op.name != ALL_SLICE for op in uses):
            continue
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
    for op in fn.ops:
        if op not in narrowed:
            rw.keep(op)
        elif any(narrowed[op]):
            rw.sub[op.results[0]] = rw.emit(make_all_slice(
                rw.value(op.operands[0]), narrowed[op], rw.mesh, op.results[0].name, op.loc))
        else:
            rw.sub[op.results[0]] = rw.value(op.operands[0])
    return rw.function(args, in_shardings=tuple(shardings))


def localize_results(fn: Function) -> Function:
    """A result produced by all_gather becomes device-local: the gather's operand is
    returned instead, its out_sharding grown by the gathered axes."""
    producer = {r: op for op in fn.ops for r in op.results}
    results, shardings = list(fn.results), list(fn.attributes["out_shardings"])
    for i, v in enumerate(fn.results):
        op = producer.get(v)
        if op is not None and op.name == ALL_GATHER:
            results[i] = op.operands[0]
            shardings[i] = _concat(shardings[i], op.params["axes"])
    if results == fn.results:
        return fn
    return replace(fn, results=results,
                   attributes={**fn.attributes, "out_shardings": tuple(shardings)})


def dce(fn: Function) -> Function:
    """Drop the ops none of whose results is used. Every PartIR:HLO op is pure."""
    live = set(fn.results)
    kept: list[Op] = []
    for op in reversed(fn.ops):
        if any(r in live for r in op.results):
            kept.append(op)
            live.update(op.operands)
    if len(kept) == len(fn.ops):
        return fn
    return replace(fn, ops=kept[::-1])


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
            if i < len(op.operands):
                stack.append((op, i + 1))
                dep = producer.get(op.operands[i])
                if dep is not None and dep not in placed:
                    stack.append((dep, 0))
                continue
            placed.add(op)
            order.append(op)
    if order == fn.ops:
        return fn
    return replace(fn, ops=order)


PASSES: tuple[Callable[[Function], Function], ...] = (
    dce, cse, merge_collectives, cancel_gather_slice, reassociate_reductions,
    fuse_reduce_scatter, fuse_all_to_all, localize_arguments, localize_results)


def optimize(fn: Function) -> Function:
    """The fusion passes in a fixed order, repeated until none rewrites anything (each
    rewrite removes a collective or moves work before a reduction, so this ends), then
    the ops ordered by demand."""
    while True:
        start = fn
        for p in PASSES:
            fn = p(fn)
        if fn is start:
            return schedule_by_demand(fn)

