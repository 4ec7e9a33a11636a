"""Control flow: `scan`, `while` and `cond`, whose sharding rules come from their bodies.

The op runs its regions; which of its dimensions may be sliced depends on what the bodies
do with them. The rule joins dimensions that must be sharded alike into groups (Shardy's
data-flow edges, collapsed into the op): an operand's dimension and the body argument it
becomes (a scanned operand's dimension d + 1 and the slice's d), a body result and the
op result it becomes, a carry's input, body argument, body result and output, every
branch of a `cond` alike, and, inside a body, the dimensions each body op's own factor
rule joins. A group is a factor of the op when slicing it everywhere runs the body on a
slice: no body op needs it replicated, has it as the minor part of a compound dimension,
cuts it out of whole operands (a concatenate along the concatenated dimension,
`Factor.whole`) or combines its tiles by position (a gather's indexed rows, a scatter's
updates), and a `while` predicate does not depend on it. An op whose tile depends on its
position otherwise (dropout's random bits, iota) computes it at the device's coordinate
(`Slicing.apply`). A body reduction over it leaves partial results: sums stay partial through
linear ops and are all-reduced where a body op needs them whole; other monoids (max,
min) are all-reduced where they are made. Each op result then has the group (the result
is tiled), is only a sum of partial results over it (a body reduction that reaches a
stacked output through linear ops alone: the weight gradients of a scan over layers,
which make a `#sum` of the op), or does not depend on it (a step counter: every slice
computes it alike).

The local op is the same control flow on the slices (`localize`): its regions on local
types, with the all-reduces, all-gathers and reduce-scatters the analysis places in
them. Dimensions of no group are need-replication factors.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from jax import lax

from partir.ir import UNKNOWN_LOCATION, Location, Op, Region, Value
from partir.ir.dtypes import canonical
from partir.ir.evaluate import REGION_EVALUATORS, run_region
from partir.ir.opnames import CONSTANT
from partir.ir.types import TensorType
from partir.ir.verifier import register_type_rule
from partir.rules.catalogue import (
    CATALOGUE,
    Carry,
    DataFlow,
    Edge,
    Kind,
    Localized,
    OpView,
    Primitive,
    RegionApplyFn,
    Slicing,
    declare,
    region_flops,
)
from partir.rules.collectives import ALL_GATHER, ALL_REDUCE, ALL_SLICE, REDUCE_SCATTER
from partir.rules.factors import PASS, REDUCTION, REPLICATION, RuleBuilder, ShardingRule

Node = int  # a dimension of a body value or of the op's operands/results
# A body op's reduction over a group: a node of the group, the results partial over it,
# and the monoid combining the slices' partial results.
_Reduction = tuple[Node, list[int], str]


@dataclass
class _Analysis:
    """Union-find over dimensions, with what each body equation does to its groups."""

    parent: list[Node] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    blocked: dict[Node, str] = field(default_factory=dict)  # node -> why it cannot be cut
    # (name, reductions) per body equation, in order: a reduction is a node of the
    # reduced group, the results that are partial over it, and its monoid
    eqns: list[tuple[str, list[_Reduction]]] = field(default_factory=list)
    # per equation, (its operands' value ids, its results' value ids) for dependencies
    flows: list[tuple[list[int | None], list[int]]] = field(default_factory=list)
    sites: list[tuple[int, int]] = field(default_factory=list)  # per op: (frame, k)
    dims_of: dict[int, list[Node]] = field(default_factory=dict)  # value id -> dims
    predicates: list[int] = field(default_factory=list)  # while predicates' value ids
    # region value -> value id; a frame is one region walked, numbered in walk order
    values: dict[Value, int] = field(default_factory=dict)
    frames: int = 0  # the frames walked so far
    # a value in the regions of a control-flow op inside a region -> per dimension, the
    # node of the inner op's operand or result dimension its factor is (slicing that
    # slices it), or why the inner op keeps it whole
    nested: dict[Value, list[Node | str]] = field(default_factory=dict)
    zeros: set[int] = field(default_factory=set)  # values that are constant zeros
    # nodes of groups an inner control-flow op sums over inside its own bodies
    summed: set[Node] = field(default_factory=set)
    _ids: itertools.count = field(default_factory=itertools.count)

    def new(self, shape: Sequence[int], blocked: str = "") -> list[Node]:
        out = []
        for n in shape:
            node = len(self.parent)
            self.parent.append(node)
            self.sizes.append(n)
            if blocked or n == 1:
                self.block([node], blocked or "the dimension has size 1")
            out.append(node)
        return out

    def block(self, nodes: Sequence[Node], why: str) -> None:
        for n in nodes:
            self.blocked.setdefault(n, why)

    def value(self, shape: Sequence[int], blocked: str = "") -> int:
        vid = next(self._ids)
        self.dims_of[vid] = self.new(shape, blocked)
        return vid

    def find(self, x: Node) -> Node:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Node, b: Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            if self.sizes[ra] != self.sizes[rb]:
                self.block((ra, rb), "the body joins it with a dimension of another size")

    def join(self, a: int, b: int) -> None:
        """Values a and b are the same data (a carry and its body argument, ...)."""
        for x, y in zip(self.dims_of[a], self.dims_of[b], strict=True):
            self.union(x, y)

    # -- bodies -------------------------------------------------------------------------
    def body(self, region: Region, args: Sequence[int]) -> list[int]:
        """Walk a region applied to the values `args`; returns its yields' values.
        Constants are values no slicing may cut (they are the same on every device)."""
        frame = self.frames
        self.frames += 1
        env: dict[Value, int] = dict(zip(region.args, args, strict=True))
        for k, op in enumerate(region.ops):
            if op.name == CONSTANT:
                (r,) = op.results
                v = env[r] = self.value(r.type.shape, blocked="a constant of the body has it")
                if not np.any(op.params["value"]):
                    self.zeros.add(v)
                continue
            outs = self.op(op, [env[x] for x in op.operands], (frame, k))
            env.update(zip(op.results, outs, strict=True))
        self.values.update(env)
        return [env[x] for x in region.yields]

    def op(self, op: Op, ins: list[int], site: tuple[int, int]) -> list[int]:
        name = op.name
        outs = [self.value(v.type.shape) for v in op.results]
        if name == "broadcast_in_dim" and ins[0] in self.zeros:
            self.zeros.add(outs[0])  # how JAX makes a zero cotangent
        in_dims = [self.dims_of[a] for a in ins]
        out_dims = [self.dims_of[o] for o in outs]
        reduced: list[_Reduction] = []
        prim = CATALOGUE.get(name)
        view = OpView.of(op)
        rule = None if prim is None or prim.rule is None else prim.rule(view)
        if rule is None:
            for dims in [*in_dims, *out_dims]:
                self.block(dims or (), f"{name} in the body has no sharding rule")
        else:
            reduced = self._factors(name, rule, in_dims, out_dims)
            if prim.data_flow is not None:
                self._nest(_groups(view), in_dims, out_dims)
        self.eqns.append((name, reduced))
        self.flows.append((ins, outs))
        self.sites.append(site)
        return outs

    def _nest(self, inner: _Groups, in_dims: list[list[Node] | None],
              out_dims: list[list[Node]]) -> None:
        """Record the values of an inner control-flow op's bodies (for the tags in them)
        by the dims of the op in this body their factors are."""
        rule = inner.rule

        def outer(n: Node | str) -> Node | str:
            f = n if isinstance(n, str) else _factor_of(inner, n)
            if isinstance(f, str):
                return f
            for dims, placed in ((rule.operand_dims[f], in_dims),
                                 (rule.result_dims[f], out_dims)):
                for t, d in enumerate(dims):
                    if d is not None and placed[t] is not None:
                        return placed[t][d]
            return "the loop's operands and results do not carry it"

        a = inner.analysis
        for value, vid in a.values.items():
            self.nested.setdefault(value, [outer(n) for n in a.dims_of[vid]])
        for value, dims in a.nested.items():
            self.nested.setdefault(value, [outer(n) for n in dims])

    def _factors(self, name: str, rule: ShardingRule, in_dims: list[list[Node] | None],
                 out_dims: list[list[Node]]) -> list[_Reduction]:
        """Join the dims each factor of a body op's rule is in; returns, per reduction
        factor, a node of its group, the results partial over it and its monoid."""
        reduced = []
        for f, factor in enumerate(rule.factors):
            if factor.size == 1:
                continue
            touched: list[Node] = []
            compound = False
            for dims_of, placed in ((rule.operands, in_dims), (rule.results, out_dims)):
                for t, dims in enumerate(dims_of):
                    for d, factors in enumerate(dims):
                        if f not in factors:
                            continue
                        if placed[t] is not None:
                            touched.append(placed[t][d])
                        compound = compound or sum(rule.factors[g].size > 1
                                                   for g in factors) > 1
            if factor.kind == REPLICATION:
                self.block(touched, factor.why or f"{name} in the body needs it whole")
                continue
            if factor.whole:
                self.block(touched, f"{name} in the body cuts it out of whole operands")
                continue
            if factor.kind == REDUCTION and CATALOGUE[name].positional:
                # Its tiles' results combine with terms placed by position (a scatter's
                # operand kept in one tile only, a gather's fill value): not yet in bodies.
                self.block(touched, f"{name} in the body combines its tiles by position")
                continue
            if compound:
                self.block(touched, f"{name} in the body splits or merges it")
                continue
            for node in touched[1:]:
                self.union(touched[0], node)
            if factor.summed_inside and touched:
                self.summed.add(touched[0])
            if factor.kind == REDUCTION and touched:
                reduced.append((touched[0], [k for k, d in enumerate(rule.result_dims[f])
                                             if d is None and k not in factor.unrelated],
                                factor.monoid or "add"))
        return reduced

    # -- groups -------------------------------------------------------------------------
    def unsliceable(self) -> dict[Node, str]:
        """The groups that cannot be sliced, with why."""
        find = self.find
        bad: dict[Node, str] = {}
        for n, why in self.blocked.items():
            bad.setdefault(find(n), why)
        for dims in self.dims_of.values():
            roots = [find(n) for n in dims]
            for r in roots:
                if roots.count(r) > 1:
                    bad.setdefault(r, "the body has it in two dimensions of one value")
        return bad

    def flow(self, g: Node, seeded: set[int], early: frozenset[int] = frozenset()
             ) -> _Flow | str:
        """What the bodies do with group g sliced, given that the `seeded` values are
        partial sums over it; or why it cannot be sliced.

        A body op that uses a partial sum other than linearly needs the whole sum: the
        operand is summed over the slices there (a sync point, an all-reduce inside the
        body), and is the same on every slice after it. The reductions making the values
        in `early` are summed where they are made instead: one sum serves every use."""
        find = self.find
        partial = set(seeded)
        # per partial sum, the reductions (or seeded values) it is a linear function of
        sources: dict[int, frozenset[int]] = {v: frozenset((v,)) for v in seeded}
        needed: set[frozenset[int]] = set()  # the sources of the sums synced at a use
        differ = {v for v, dims in self.dims_of.items() if any(find(n) == g for n in dims)}
        differ |= partial
        syncs: set[Site] = set()
        monoids: dict[Site, str] = {}  # the syncs combining with another monoid than add
        for (name, reduced), (ins, outs), site in zip(self.eqns, self.flows, self.sites,
                                                       strict=True):
            at = [i for i, a in enumerate(ins) if a is not None and a in partial]
            synced: list[int] = []
            if at and _linear(name, ins, at, differ):
                partial.update(outs)
                made = frozenset().union(*(sources[ins[i]] for i in at))
                sources.update((o, made) for o in outs)
            elif at:
                synced = at
                syncs.update((*site, i) for i in at)
                needed.update(sources[ins[i]] for i in at)
            if any(a is not None and a in differ and i not in synced
                   for i, a in enumerate(ins)):
                differ.update(outs)
            for n, ks, monoid in reduced:
                if find(n) != g:
                    continue
                for k in ks:
                    if monoid != "add":
                        # Only sums stay partial through linear ops: any other monoid
                        # combines the slices' results where they are made.
                        monoids[(*site, -1 - k)] = monoid
                    if outs[k] in early or monoid != "add":  # whole on every slice now
                        syncs.add((*site, -1 - k))
                        partial.discard(outs[k])
                        differ.discard(outs[k])
                    else:
                        partial.add(outs[k])
                        differ.add(outs[k])
                        sources[outs[k]] = frozenset((outs[k],))
        if any(find(n) == g for v in partial for n in self.dims_of[v]):
            return "the body sums over it into a value that also has it"
        if any(v in differ for v in self.predicates):
            # every slice must take the same branch, or stop alike
            return "the loop's predicate depends on it"
        single = frozenset(v for made in needed if len(made) == 1 for v in made) - seeded
        return _Flow(partial, differ, syncs, single, monoids)


# A place in a body where a partial sum is summed over the slices: (frame, equation,
# operand) for an equation's operand, (frame, equation, -1 - k) for its k-th result,
# (frame, -1, k) for the body's k-th result.
Site = tuple[int, int, int]


@dataclass(frozen=True)
class _Flow:
    partial: set[int]  # values that are partial sums over the group
    differ: set[int]  # values that differ between the group's slices
    syncs: set[Site]
    # reductions whose every synced use could take one sum where they are made
    single: frozenset[int] = frozenset()
    monoids: Mapping[Site, str] = field(default_factory=dict)  # syncs not summing


def _linear(name: str, ins: list[int | None], at: list[int], differ: set[int]) -> bool:
    """Whether the op's results are partial sums when its operands `at` are, as its
    declaration's `linear` says (and so the sum of the slices' results is the op applied
    to the sum); `differ` are the values that differ between slices."""
    prim = CATALOGUE.get(name)
    how = None if prim is None else prim.linear
    # literals count as operands that are not partial sums: c + 1 is not linear
    others = [i for i in range(len(ins)) if i not in at]
    independent = all(ins[i] is None or ins[i] not in differ for i in others)
    if how == "all":
        return not others
    if how == "one":
        return len(at) == 1 and independent
    if how == "cases":
        return others == [0] and independent
    return isinstance(how, tuple) and set(at) <= set(how) and independent


@dataclass(frozen=True)
class _Edges:
    """How a control-flow op's operands and results meet its bodies: per result, the
    body results it is made of, and which results are carries (fed back to the body, so
    never partial sums: the next iteration would add to them)."""

    operands: list[int]
    results: list[int]
    sources: list[list[int]]
    carries: dict[int, int] = field(default_factory=dict)  # result -> its body argument
    # carries whose initial value is zero (the frontend's `_zero_init`): each slice may
    # start from zero and end with a partial sum, as a gradient accumulator does
    zero: frozenset[int] = frozenset()
    body: int | None = None  # the frame whose results are the carries' next values
    # Operands the bodies take as they are, each iteration (consts, a scan's scanned
    # slices, a cond's operands; not carries): operand -> (body frame, its argument
    # position, the operand's first dimension the argument has: 1 for a scanned operand,
    # else 0).
    entries: dict[int, list[Entry]] = field(default_factory=dict)
    # Results the bodies make anew each iteration (a scan's stacked results, a cond's;
    # not carries): result -> (body, its result position, the result's first dimension
    # the body's result has).
    exits: dict[int, list[Entry]] = field(default_factory=dict)
    tops: list[int] = field(default_factory=list)  # the bodies' frames, in params order


Entry = tuple[int, int, int]


def scan_flow(view: OpView) -> DataFlow:
    """The consts and the scanned operands' slices (one leading dimension fewer) enter
    the body each iteration, the carries loop through it, and each iteration's body
    results make one slice of the stacked results."""
    nc, nk = view.params["num_consts"], view.params["num_carry"]
    return DataFlow(
        entries=(*(Edge(i, 0, i) for i in range(nc)),
                 *(Edge(i, 0, i, lead=1) for i in range(nc + nk, len(view.in_types)))),
        exits=tuple(Edge(k, 0, k, lead=1) for k in range(nk, len(view.out_types))),
        carries=tuple(Carry(nc + k, ((0, nc + k),), (0, k), k) for k in range(nk)),
        trips=(view.params["length"],))


def while_flow(view: OpView) -> DataFlow:
    """The predicate's consts enter region 0 (the predicate), the body's region 1; the
    carries are arguments of both, and the body makes their next values."""
    cn, bn = view.params["cond_nconsts"], view.params["body_nconsts"]
    nk = len(view.in_types) - cn - bn
    return DataFlow(
        entries=(*(Edge(i, 0, i) for i in range(cn)),
                 *(Edge(cn + i, 1, i) for i in range(bn))),
        exits=(),
        carries=tuple(Carry(cn + bn + k, ((0, cn + k), (1, bn + k)), (1, k), k)
                      for k in range(nk)),
        predicate=(0, 0), trips=(None, None))


def run_scan(op: Op, operands: Sequence[Any]) -> list[Any]:
    p = op.params
    nc, nk = p["num_consts"], p["num_carry"]
    consts, init, xs = operands[:nc], operands[nc:nc + nk], operands[nc + nk:]
    (body,) = op.regions

    def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        outs = run_region(body, [*consts, *carry, *x])
        return outs[:nk], outs[nk:]

    carry, ys = lax.scan(step, list(init), list(xs), length=p["length"],
                         reverse=p["reverse"], unroll=p["unroll"])
    return [*carry, *ys]


def run_while(op: Op, operands: Sequence[Any]) -> list[Any]:
    cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
    cond_consts, body_consts = operands[:cn], operands[cn:cn + bn]
    cond, body = op.regions
    return list(lax.while_loop(lambda c: run_region(cond, [*cond_consts, *c])[0],
                               lambda c: run_region(body, [*body_consts, *c]),
                               list(operands[cn + bn:])))


def run_cond(op: Op, operands: Sequence[Any]) -> list[Any]:
    index, *args = operands
    branches = [functools.partial(_run_branch, region) for region in op.regions]
    return list(lax.switch(index, branches, *args))


def _run_branch(region: Region, *args: Any) -> list[Any]:
    return run_region(region, args)


def cond_flow(view: OpView) -> DataFlow:
    """The operands after the branch index enter every branch; every branch makes the
    results."""
    branches = range(len(view.regions))
    return DataFlow(
        entries=tuple(Edge(i, b, i - 1) for b in branches for i in range(1, len(view.in_types))),
        exits=tuple(Edge(k, b, k) for b in branches for k in range(len(view.out_types))),
        trips=(1,) * len(branches), alternatives=True)


# Why the scanned dimension stays whole, with what a user can do instead: a loop over
# microbatches (gradient accumulation) is the common case, whose batch tiling reaches the
# scanned dimension through the reshape that makes the microbatches.
_SCANNED_OPERAND = ("it is the scanned dimension: every device runs every iteration, each "
                    "on one slice of it; to run the loop sliced, tile another of its "
                    "dimensions (partir.tag the scanned value to name it in a tactic)")
_STACKED_RESULT = "it is the scanned dimension: each iteration makes one slice of it"


def _edges(a: _Analysis, view: OpView) -> _Edges:
    """The op's values in the analysis, its regions walked, joined along its data-flow
    edges."""
    flow = CATALOGUE[view.name].data_flow(view)
    ops = [a.value(t.shape) for t in view.in_types]
    res = [a.value(t.shape) for t in view.out_types]
    args: list[list[int]] = [[-1] * len(r.args) for r in view.regions]
    for e in flow.entries:
        v = ops[e.value]
        if e.lead:  # the region sees one slice of the leading dimensions
            a.block(a.dims_of[v][:e.lead], _SCANNED_OPERAND)
            sliced = a.value(view.in_types[e.value].shape[e.lead:])
            for x, y in zip(a.dims_of[v][e.lead:], a.dims_of[sliced], strict=True):
                a.union(x, y)
            v = sliced
        args[e.region][e.position] = v
    for c in flow.carries:
        for region, position in c.args:
            args[region][position] = ops[c.operand]
    tops, outs = [], []
    for region, region_args in zip(view.regions, args, strict=True):
        tops.append(a.frames)
        outs.append(a.body(region, region_args))
    if flow.predicate is not None:
        a.predicates.append(outs[flow.predicate[0]][flow.predicate[1]])
    sources: list[list[int]] = [[] for _ in res]
    for c in flow.carries:
        made = outs[c.made[0]][c.made[1]]
        a.join(ops[c.operand], made)
        a.join(made, res[c.result])
        sources[c.result].append(made)
    for e in flow.exits:
        made, r = outs[e.region][e.position], res[e.value]
        a.block(a.dims_of[r][:e.lead], _STACKED_RESULT)
        for x, y in zip(a.dims_of[made], a.dims_of[r][e.lead:], strict=True):
            a.union(x, y)
        sources[e.value].append(made)
    entries: dict[int, list[Entry]] = {}
    for e in flow.entries:
        entries.setdefault(e.value, []).append((tops[e.region], e.position, e.lead))
    exits: dict[int, list[Entry]] = {}
    for e in flow.exits:
        exits.setdefault(e.value, []).append((tops[e.region], e.position, e.lead))
    body = tops[flow.carries[0].made[0]] if flow.carries else None
    return _Edges(ops, res, sources, {c.result: ops[c.operand] for c in flow.carries},
                  _zeros(view.params), body, entries, exits, tops)


def carry_inits(name: str, params: Any, operands: Sequence[Value]) -> Sequence[Value] | None:
    """The operands a loop primitive starts its carries from (None: not a loop)."""
    prim = CATALOGUE.get(name)
    if prim is None or prim.data_flow is None:
        return None
    carries = prim.data_flow(OpView(name, params, tuple(v.type for v in operands), ())).carries
    return [operands[c.operand] for c in carries] if carries else None


def _zeros(params: Any) -> frozenset[int]:
    return frozenset(k for k, z in enumerate(params.get("_zero_init", ())) if z)


# The control-flow primitives and their data-flow edges: kept whole by the frontend, their
# bodies' tags named by tactics (`partir.frontend.BodyTag`).
_FLOWS = {"scan": (scan_flow, run_scan), "while": (while_flow, run_while),
          "cond": (cond_flow, run_cond)}
CONTROL_FLOW = tuple(_FLOWS)


@dataclass(frozen=True)
class _Groups:
    """The analysis of one op on its global types: a rule, and per factor the nodes of
    the op's dims it is made of (to read local sizes from)."""

    rule: ShardingRule
    nodes: dict[int, list[Node]]  # factor -> the group's nodes, by operand then result
    analysis: _Analysis
    why: dict[Node, str]  # group -> why it is not a factor of the op
    syncs: dict[int, frozenset[Site]]  # factor -> where its partial sums are summed
    monoids: dict[Site, str]  # the syncs combining with another monoid than add
    entries: dict[int, list[Entry]]  # operand -> where the bodies take it (_Edges)
    exits: dict[int, list[Entry]]  # result -> where the bodies make it (_Edges)
    results: list[int]  # the results' values
    tops: list[int]  # the bodies' frames (_Edges)
    regions: tuple[Region, ...]  # analysed: its values are those of `analysis`


def _key(view: OpView) -> tuple:
    return (view.name, tuple(sorted((k, v) for k, v in view.params.items())),
            view.in_shapes, view.out_shapes, tuple(map(id, view.regions)))


def _analyze(view: OpView) -> _Groups:
    a = _Analysis()
    edges = _edges(a, view)
    bad = a.unsliceable()
    find = a.find
    b = RuleBuilder([t.rank for t in view.in_types], [t.rank for t in view.out_types])
    placed: set[Node] = set()
    shown: set[Node] = set()  # the factors' groups that some result has
    nodes: dict[int, list[Node]] = {}
    syncs: dict[int, frozenset[Site]] = {}
    monoids: dict[Site, str] = {}
    differ: dict[int, set[int]] = {}  # factor -> the values its slices make differ
    why = dict(bad)  # group -> why it is not a factor of the op
    roots = sorted({find(n) for v in (*edges.operands, *edges.results)
                    for n in a.dims_of[v]} - set(bad))
    for g in roots:
        operands = {i: d for i, v in enumerate(edges.operands)
                    for d, n in enumerate(a.dims_of[v]) if find(n) == g}
        results = {k: d for k, v in enumerate(edges.results)
                   for d, n in enumerate(a.dims_of[v]) if find(n) == g}
        counts = [sum(find(n) == g for n in a.dims_of[v])
                  for v in (*edges.operands, *edges.results)]
        if max(counts) > 1:
            why[g] = "it is two dimensions of one operand or result"
            continue
        if not operands:
            why[g] = "only the body makes it"
            continue
        # zero-initialised carries without the group may be partial sums over it
        seeds = {edges.carries[k] for k in edges.zero if k not in results}
        for seeded in ((seeds, set()) if seeds else (set(),)):
            flow = a.flow(g, seeded)
            if not isinstance(flow, str) and flow.single:
                # a reduction used whole in several places: summed once, where it is made
                flow = a.flow(g, seeded, flow.single)
            actions = flow if isinstance(flow, str) else _actions(
                results, edges, flow, seeded, a.zeros)
            if not isinstance(actions, str):
                break
        if isinstance(actions, str):
            why[g] = actions
        else:
            sums, unrelated, synced = actions
            kind, monoid = (REDUCTION, "add") if sums else (PASS, None)
            f = b.factor(a.sizes[g], operands, results, kind, monoid, unrelated,
                         summed_inside=bool(synced) or any(find(n) == g for n in a.summed))
            if synced:
                syncs[f] = frozenset(synced)
                monoids.update(flow.monoids)
            differ[f] = flow.differ
            nodes[f] = [a.dims_of[v][d] for v, d in (
                *((edges.operands[i], d) for i, d in operands.items()),
                *((edges.results[k], d) for k, d in results.items()))]
            placed.update(n for v in (*edges.operands, *edges.results)
                          for n in a.dims_of[v] if find(n) == g)
            if results:
                shown.add(g)
    for i, v in enumerate(edges.operands):
        entry = edges.entries.get(i)
        for d, n in enumerate(a.dims_of[v]):
            # Sliced, an operand the bodies take as it is can be all-gathered where they
            # take it (ZeRO-3 through a scan over layers: a layer's parameters gathered
            # one layer at a time); no result depends on that slicing. Of a factor, only
            # where a result has it too: the result's local size tells the local op that
            # the factor is whole, which a factor of operands the bodies take alone
            # cannot (sliced to be gathered or sliced as the factor, they look alike).
            if entry and a.sizes[n] > 1 and d >= entry[0][2] and (
                    n not in placed or find(n) in shown):
                b.gatherable.add((i, d))
            if n not in placed:
                b.replicated(a.sizes[n], operands={i: d}, why=why.get(find(n), ""))
    for k, v in enumerate(edges.results):
        exit_ = edges.exits.get(k)
        for d, n in enumerate(a.dims_of[v]):
            # A sum over a factor the bodies make anew each iteration can be
            # reduce-scattered where they make it (ZeRO's gradients of a scan over layers).
            if exit_ and a.sizes[n] > 1 and d >= exit_[0][2]:
                b.scatterable.add((k, d))
            if n not in placed:
                b.replicated(a.sizes[n], results={k: d}, why=why.get(find(n), ""))
    for f, g in itertools.combinations(sorted(differ), 2):
        if differ[f].isdisjoint(differ[g]):
            b.slice_together(f, g)
    return _Groups(b.build(), nodes, a, why, syncs, monoids, edges.entries, edges.exits,
                   edges.results, edges.tops, view.regions)


def _actions(results: dict[int, int], edges: _Edges, flow: _Flow, seeded: set[int],
             zeros: set[int]) -> tuple[list[int], list[int], set[Site]] | str:
    """The op results that are partial sums over the group and those that do not depend
    on it (the rest are tiled), and the sync points of its flow with those of the carries
    summed before the next iteration; or why one result is neither. A carry is a partial
    sum only if it starts from zero (seeded), and then it must end as one; a carry that
    does not start from zero but ends as one is summed over the slices at the body's
    end."""
    sums, unrelated, synced = [], [], set(flow.syncs)
    partial, differ = flow.partial, flow.differ
    for k, srcs in enumerate(edges.sources):
        arg = edges.carries.get(k)
        started = arg is not None and arg in seeded
        if k in results:
            if started:
                return f"carry {k} would start from zero on every slice yet be tiled by it"
            continue
        # a zero is a partial sum of zeros (a branch with no gradient for a value)
        if all(v in partial or v in zeros for v in srcs) and (arg is None or started):
            sums.append(k)
        elif all(v not in differ for v in srcs) and not started:
            unrelated.append(k)
        elif arg is not None and not started and all(v in partial for v in srcs):
            synced.add((edges.body, -1, k))
            unrelated.append(k)
        elif arg is not None:
            return (f"carry {k} depends on it without having it: each slice would carry a "
                    f"different value")
        else:
            return f"result {k} depends on it but neither has it nor sums over it"
    return sums, unrelated, synced


_ANALYSES: dict[tuple, _Groups] = {}


def _groups(view: OpView) -> _Groups:
    """The analysis of the op, once per kind of op (the layers of a model repeat it)."""
    key = _key(view)
    try:
        found = _ANALYSES.get(key)
    except TypeError:  # unhashable parameters
        return _analyze(view)
    # Keyed by the regions' ids: one that died may have left its id to another.
    if found is not None and any(r is not f for r, f in zip(view.regions, found.regions,
                                                             strict=True)):
        found = None
    if found is None:
        if len(_ANALYSES) > 256:
            _ANALYSES.clear()
        found = _ANALYSES[key] = _analyze(view)
    return found


def control_rule(view: OpView) -> ShardingRule:
    return _groups(view).rule


def body_factor(view: OpView, value: Value, dim: int) -> int | str:
    """The factor of the op's rule that dimension `dim` of a value in its regions belongs
    to (slicing the factor slices it), or why it has none (the reason its group is
    replicated, as the rule's conflicts give it)."""
    groups = _groups(view)
    a = groups.analysis
    vid = a.values.get(value)
    if vid is not None:
        return _factor_of(groups, a.dims_of[vid][dim])
    nested = a.nested.get(value)
    if nested is None:
        return "it is not a value of the loop's bodies"
    n = nested[dim]
    return n if isinstance(n, str) else _factor_of(groups, n)


def _factor_of(groups: _Groups, n: Node) -> int | str:
    """The factor of the op's rule whose group node n is in, or why it has none."""
    a = groups.analysis
    g = a.find(n)
    for f, nodes in groups.nodes.items():
        if a.find(nodes[0]) == g:
            return f
    return groups.why.get(g) or "the loop's operands and results do not carry it"


# --- the local op: the same control flow on slices, bodies traced again -----------------


def _global_view(view: OpView) -> OpView:
    """The op on global types, which its regions' types give (a local view has the
    global parameters and regions)."""
    p, regions = view.params, view.regions
    args = [[v.type for v in r.args] for r in regions]
    yields = [[v.type for v in r.yields] for r in regions]
    if view.name == "scan":
        n, nc, nk = p["length"], p["num_consts"], p["num_carry"]
        ins = [t if i < nc + nk else TensorType((n, *t.shape), t.dtype)
               for i, t in enumerate(args[0])]
        outs = [t if k < nk else TensorType((n, *t.shape), t.dtype)
                for k, t in enumerate(yields[0])]
    elif view.name == "while":
        ins = [*args[0][:p["cond_nconsts"]], *args[1]]
        outs = yields[1]
    else:
        ins = [view.in_types[0], *args[0]]
        outs = yields[0]
    return OpView(view.name, p, tuple(ins), tuple(outs), regions=regions)


def _type_error(op: Op) -> str | None:
    """The op's operand and result types must be those its regions' types give (a scan's
    scanned operands and stacked results with its length in front)."""
    if not all(isinstance(v.type, TensorType) for v in (*op.operands, *op.results)):
        return None  # on distributed types: its dialect's rules check it
    given = OpView.of(op)
    want = _global_view(given)
    for what, got, expected in (("operand", given.in_types, want.in_types),
                                ("result", given.out_types, want.out_types)):
        if len(got) != len(expected):
            return f"{len(got)} {what}s, its regions give {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            if g.shape != e.shape or canonical(g.dtype) != canonical(e.dtype):
                return f"{what} {i} is {g}, its regions give {e}"
    return None


for _name in _FLOWS:
    register_type_rule(_name)(_type_error)


def localize(view: OpView) -> Localized:
    """The op's parameters and regions on local types: every dimension of a sliced group
    at its local size, read from the op's local operands and results, a sliced group's
    partial sums all-reduced over the axes slicing it where a region needs them whole, a
    sliced operand a region needs whole all-gathered where it takes it, and a stacked
    sum reduce-scattered where a region makes it (`view.slicing` names the axes)."""
    whole = _global_view(view)
    groups = _groups(whole)
    a, rule = groups.analysis, groups.rule
    local: dict[Node, int] = {}
    plan = _Plan(monoids=groups.monoids)

    def axes_of(i: int, dim: int, what: str, result: bool = False) -> tuple[str, ...]:
        if view.slicing is None:
            raise ValueError(f"{view.name} {what} over the axes slicing its dimension {dim} "
                             f"of {'result' if result else 'operand'} {i}, but its local "
                             f"view does not say which axes those are")
        return (view.slicing.result_axes if result else view.slicing.operand_axes)[i][dim]

    # (operand, dim, local size, the group it is gathered into, None: whole)
    gathered: list[tuple[int, int, int, Node | None]] = []
    for f, nodes in groups.nodes.items():
        # The group's local size is its members' that are not gathered: the largest.
        members = {(i, d): view.in_types[i].shape[d]
                   for i, d in enumerate(rule.operand_dims[f]) if d is not None}
        size = max([*members.values(), *(view.out_types[k].shape[d] for k, d in
                                         enumerate(rule.result_dims[f]) if d is not None)])
        g = a.find(nodes[0])
        local[g] = size
        gathered += [(i, d, n, g) for (i, d), n in members.items() if n < size]
        if size == a.sizes[g]:
            continue
        # A member at the group's local size: an operand's dim, or else a result's (a
        # group only results carry sliced, its operands gathered).
        i, dim, result = [
            *((i, d, False) for (i, d), n in members.items() if n == size),
            *((k, d, True) for k, d in enumerate(rule.result_dims[f])
              if d is not None and view.out_types[k].shape[d] == size)][0]
        if view.slicing is not None:  # what a control-flow op in the bodies is told
            plan.group_axes[g] = axes_of(i, dim, "slices", result)
        if f not in groups.syncs:
            continue
        axes = axes_of(i, dim, "sums partial results", result)
        for site in groups.syncs[f]:
            have = plan.syncs.get(site, ())
            plan.syncs[site] = have + tuple(x for x in axes if x not in have)
    for i, d in rule.gatherable:  # sliced dims of no factor: gathered
        n = view.in_types[i].shape[d]
        if n < whole.in_types[i].shape[d] and all(
                rule.factors[x].kind == REPLICATION for x in rule.operands[i][d]):
            gathered.append((i, d, n, None))
    for k, d in rule.scatterable:  # a sum tiled where the bodies make it
        body_size = local.get(a.find(a.dims_of[groups.results[k]][d]),
                              whole.out_types[k].shape[d])
        if view.out_types[k].shape[d] < body_size:
            axes = axes_of(k, d, "reduce-scatters a result", result=True)
            for body, position, first in groups.exits[k]:
                plan.scatters.setdefault((body, position), []).append((d - first, axes))
    for i, d, n, g in gathered:
        if (i, d) not in rule.gatherable:
            raise ValueError(f"{view.name} takes dimension {d} of operand {i} sliced to {n}, "
                             f"which its bodies can neither slice nor gather")
        axes = axes_of(i, d, "gathers an operand")
        # Gathered into a group the bodies run sliced on `keep`: where those are the
        # operand's major axes, gathering the others gives the group's tile; otherwise the
        # tile holds other positions than the operand's chunks (a:(3)2 of an operand on
        # a:(1)3, a:(3)2), taken from the whole operand.
        keep = plan.group_axes.get(g, ()) if g is not None else ()
        if axes[:len(keep)] == keep:
            axes, keep = axes[len(keep):], ()
        for body, position, first in groups.entries[i]:
            plan.gathers.setdefault((body, position), []).append((d - first, n, axes, keep))
    params = view.params
    if not plan.syncs and not plan.gathers and not plan.scatters and not any(
            local[g] != a.sizes[g] for g in local):
        return Localized(params, view.regions)

    def size(n: Node) -> int:
        return local.get(a.find(n), a.sizes[n])

    if view.slicing is not None:
        plan.sizes, plan.apply = view.slicing.sizes, view.slicing.apply
    # the regions' frames, in the order the analysis walked them: the regions' order
    return Localized(params, tuple(
        _local_region(region, top, a, size, plan)
        for top, region in zip(groups.tops, view.regions, strict=True)))


@dataclass
class _Plan:
    """The collectives a local op's bodies hold, each over the axes slicing its group."""

    syncs: dict[Site, tuple[str, ...]] = field(default_factory=dict)
    monoids: Mapping[Site, str] = field(default_factory=dict)  # a sync's if not add
    # (body, argument position) -> (the argument's dimension, its local size, axes)
    # ... -> (the argument's dimension, its local size, the axes gathered, then the axes
    # whose tile of the gathered dimension is kept)
    gathers: dict[tuple[int, int],
                  list[tuple[int, int, tuple[str, ...], tuple[str, ...]]]] = field(
        default_factory=dict)
    # (body, result position) -> (the result's dimension, axes)
    scatters: dict[tuple[int, int], list[tuple[int, tuple[str, ...]]]] = field(
        default_factory=dict)
    sizes: Mapping[str, int] = field(default_factory=dict)  # the axes' sizes
    # a sliced group -> the axes slicing it
    group_axes: dict[Node, tuple[str, ...]] = field(default_factory=dict)
    apply: RegionApplyFn | None = None  # `Slicing.apply`

    def axes(self) -> list[str]:
        return sorted({x for axes in self.syncs.values() for x in axes} |
                      {x for gs in self.gathers.values() for _, _, axes, keep in gs
                       for x in (*axes, *keep)} |
                      {x for ss in self.scatters.values() for _, axes in ss for x in axes})


def _local_region(region: Region, top: int, a: _Analysis, size: Callable[[Node], int],
                  plan: _Plan) -> Region:
    """The region (analysed as frame `top`) on local types, every op's parameters (and
    an inner control-flow op's regions) localized, with the plan's all-reduces,
    all-gathers and reduce-scatters."""
    sizes = plan.sizes
    ops: list[Op] = []
    sub: dict[Value, Value] = {}

    def local_type(v: Value) -> TensorType:
        return TensorType(tuple(size(n) for n in a.dims_of[a.values[v]]), v.type.dtype)

    def emit(name: str, x: Value, t: TensorType, loc: Location, **params: Any) -> Value:
        out = Value(t)
        ops.append(Op(name, [x], [out], params, loc=loc))
        return out

    def per_dim(rank: int, dim: int, axes: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        return tuple(axes if d == dim else () for d in range(rank))

    def summed(x: Value, site: Site, axes: tuple[str, ...], loc: Location) -> Value:
        return emit(ALL_REDUCE, x, x.type, loc, axes=axes,
                    monoid=plan.monoids.get(site, "add"))

    def axes_per_dim(v: Value) -> tuple[tuple[str, ...], ...]:
        return tuple(plan.group_axes.get(a.find(n), ()) for n in a.dims_of[a.values[v]])

    args = []
    for p, arg in enumerate(region.args):
        t = local_type(arg)
        gathers = plan.gathers.get((top, p), ())
        shape = list(t.shape)
        for dim, n, _, _ in gathers:  # the argument arrives sliced
            shape[dim] = n
        x = Value(t.with_shape(tuple(shape)), arg.name)
        args.append(x)
        for dim, _, axes, keep in gathers:
            # One axis at a time, the minor one first (the chunk order of several axes):
            # the Core interpreter runs the region under a vmap per axis, whose batching
            # rules take a single axis name.
            for axis in reversed(axes):
                shape[dim] *= sizes[axis]
                x = emit(ALL_GATHER, x, x.type.with_shape(tuple(shape)), UNKNOWN_LOCATION,
                         axes=per_dim(len(shape), dim, (axis,)))
            if keep:  # the group's tile of the whole operand
                shape[dim] //= int(np.prod([sizes[k] for k in keep]))
                x = emit(ALL_SLICE, x, x.type.with_shape(tuple(shape)), UNKNOWN_LOCATION,
                         axes=per_dim(len(shape), dim, keep))
        sub[arg] = x
    made: dict[Value, Location] = {}  # where each value is made, for its sum's line
    whole: dict[Value, Value] = {}  # a partial sum is summed once for all its uses

    def read_whole(v: Value, site: Site) -> Value:
        axes = plan.syncs.get(site)
        if not axes:
            return sub[v]
        if v not in whole:
            whole[v] = summed(sub[v], site, axes, made.get(v, UNKNOWN_LOCATION))
        return whole[v]

    for k, op in enumerate(region.ops):
        if op.name == CONSTANT:  # the same on every device
            ops.append(op)
            sub[op.results[0]] = op.results[0]
            continue
        operands = [read_whole(v, (top, k, i)) for i, v in enumerate(op.operands)]
        results = [Value(local_type(r), r.name) for r in op.results]
        params, regions = op.params, op.regions
        prim = CATALOGUE.get(op.name)
        if prim is not None and prim.localize is not None:
            slicing = None
            if prim.syncs:  # a control-flow op in a region: the axes slicing it
                slicing = Slicing(tuple(map(axes_per_dim, op.operands)), sizes,
                                  tuple(map(axes_per_dim, op.results)), plan.apply)
            local = prim.localize(OpView(
                op.name, op.params, tuple(v.type for v in operands),
                tuple(v.type for v in results), slicing, tuple(op.regions)))
            if isinstance(local, Localized):
                params, regions = local.params, list(local.regions)
            else:
                params = local
        sliced = _sliced_factors(op, a, plan) if prim is not None and prim.positional else {}
        if sliced:
            if plan.apply is None:
                raise ValueError(f"{op.name} at {op.loc} computes its tile from its position: "
                                 f"localizing its region needs `Slicing.apply`")
            made_ops, results = plan.apply(op, params, operands, [r.type for r in results],
                                           sliced, sizes)
            ops.extend(made_ops)
        else:
            ops.append(Op(op.name, operands, results, params, regions, op.loc, op.prim))
        for r, (g, lr) in enumerate(zip(op.results, results, strict=True)):
            made[g] = op.loc
            site = (top, k, -1 - r)
            axes = plan.syncs.get(site)
            sub[g] = summed(lr, site, axes, op.loc) if axes else lr
    yields = [read_whole(v, (top, -1, k)) for k, v in enumerate(region.yields)]
    for k, x in enumerate(yields):
        for dim, axes in plan.scatters.get((top, k), ()):
            for axis in axes:  # the major axis first: its chunk holds the minor's
                shape = list(x.type.shape)
                shape[dim] //= sizes[axis]
                x = emit(REDUCE_SCATTER, x, x.type.with_shape(tuple(shape)),
                         made.get(region.yields[k], UNKNOWN_LOCATION),
                         axes=per_dim(len(shape), dim, (axis,)), monoid="add")
        yields[k] = x
    return Region(args, ops, yields)


def _sliced_factors(op: Op, a: _Analysis, plan: _Plan) -> dict[int, tuple[str, ...]]:
    """The factors of a region op's rule that the plan slices, each with its axes."""
    view = OpView.of(op)
    rule = CATALOGUE[op.name].rule(view)
    out = {}
    for f in range(len(rule.factors)):
        at = [(v, d) for vs, dims in ((op.operands, rule.operand_dims[f]),
                                       (op.results, rule.result_dims[f]))
              for v, d in zip(vs, dims, strict=True) if d is not None]
        if at:
            v, d = at[0]
            axes = plan.group_axes.get(a.find(a.dims_of[a.values[v]][d]))
            if axes:
                out[f] = axes
    return out


_CONTROL = Primitive(
    Kind.KERNEL, region_flops, control_rule, localize=localize, masks_padding=False,
    syncs=True,
    doc="groups of dims the bodies keep apart -> tile; partial sums reaching stacked "
        "outputs -> #sum; the rest replicated")
for _name, (_flow, _run) in _FLOWS.items():
    declare(_name, replace(_CONTROL, data_flow=_flow))
    REGION_EVALUATORS.register(_name, _run)
