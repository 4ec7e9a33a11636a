"""PartIR:Core -> PartIR:SPMD: the translation relation  M; sigmas |- <C; e> ~> e'  of the
paper (App. C, fig. Core-to-SPMD-translation), transcribed as one recursive pass.

The state is the rules' own:
- M maps each Core value translated so far to its SPMD value; function arguments become
  arguments of type dtensor<{}, [n,...]>;
- the nesting level sigmas, of which the translation needs each enclosing loop's axis and
  Core range value (the actions are consumed where the loop is translated);
- the simple context C: the op/slice definitions seen at the current level since the last
  loop, not emitted yet.
An SPMD program is flat (executes do not nest), so the SPMD contexts the rules stack up
(C^, C^_1, C^_*) are emitted in order into one list of ops.

Our loops may yield several values, one action each; the rules generalise per yielded
value: SLoop applies one action to each result, and at a `yield` the values that need an
execute (SYldL, SYldP) leave one execute together while the others are yielded as they
are (SYldC).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import partir.cancel as cancel
from partir.core.actions import Action, Tile
from partir.core.dialect import LOOP
from partir.ir import Function, Op, RangeType, Region, Type, Value
from partir.ir.fragments import Fragments, rewired, sharing
from partir.mesh import Mesh
from partir.spmd.ops import make_execute, make_redistribute, make_tile_reduce, tile_reduce_type
from partir.spmd.types import DTensorType


@dataclass(frozen=True)
class _Level:
    """One loop of the nesting level sigmas: its axis and the Core value of its range."""

    axis: str
    range: Value


def _axes(levels: Sequence[_Level]) -> tuple[str, ...]:
    """axes(sigmas)."""
    return tuple(lvl.axis for lvl in levels)


def lower_core_to_spmd(fn: Function, mesh: Mesh | Mapping[str, int],
                       fragments: Fragments | None = None) -> Function:
    """The SPMD program of a materialized Core function. `fragments`: the translations of
    top-level loops, executes and arguments of functions lowered before, reused where
    this one has the same Core ops reading translations of the same types and names
    (`partir.ir.fragments`, `_Lowering.reused`)."""
    return _Lowering(fn, mesh if isinstance(mesh, Mesh) else Mesh(mesh), fragments).run()


class _Lowering:
    def __init__(self, fn: Function, mesh: Mesh, fragments: Fragments | None) -> None:
        self.fn = fn
        self.mesh = mesh
        self.fragments = fragments
        self.mesh_items = tuple(mesh.items())  # in the fragments' keys
        self.out: list[Op] = []
        # SSA values are unique, so extending M in place is the rules' extension of M:
        # a mapping added inside a loop body is never looked up outside it.
        self.M: dict[Value, Value] = {}
        self.last_use: dict[Value, int] = {}
        # L(mu) per type, for the locals of executes: values share few types, and share
        # the type objects, so they are keyed by identity (as `reduced_types`).
        self.local_types: dict[int, tuple[Type, Type]] = {}
        # The type of each (stacked type, axis, action, size) a loop action reduces, for
        # the tile_reduces of the loops' results: a model's layers repeat them. Keyed by
        # the type's and action's identity (both are shared: `DTensorType.of`, the loops'
        # actions), which costs no Python-level hash of either; the entry holds them, so
        # their ids stay theirs.
        self.reduced_types: dict[tuple, tuple[DTensorType, Action, DTensorType]] = {}
        _record_last_uses(fn.ops, fn.results, self.last_use)

    def run(self) -> Function:
        args = [self.argument(a) for a in self.fn.args]
        self.M.update(zip(self.fn.args, args, strict=True))
        results = self.translate((), self.fn.ops, self.fn.results)
        # The Mesh prints as the Core function's mesh attribute does.
        attributes = {**self.fn.attributes, "mesh": self.mesh}
        return Function(self.fn.name, args, self.out, results, list(self.fn.result_names),
                        attributes)

    def argument(self, a: Value) -> Value:
        def make() -> Value:
            return Value(DTensorType.of(a.type), name=a.name)

        if self.fragments is None:
            return make()
        return self.fragments.get_or_make(("spmd", id(a)), a, make)

    def translate(self, levels: tuple[_Level, ...], ops: Sequence[Op],
                  yields: Sequence[Value]) -> list[Value]:
        """M; levels |- <-; e> ~> e' for e = `ops; yield yields`: emits the let-bindings of
        e' and returns the values e' yields."""
        C: list[Op] = []
        token = cancel.current()
        for pos, op in enumerate(ops):
            if token is not None and token.cancelled:
                token.check()
            if op.name == LOOP:
                self.loop(levels, C, op, pos)
                C = []  # SLoop translates the rest e2 in the empty context
            else:
                # SOp / SSlice (and `tag`, `constant`, which are ops too): the definition
                # joins C. Iterating rather than recursing on the rest of e keeps the
                # Python stack as deep as the loop nest, not as long as the program.
                C.append(op)
        if not levels:
            return self.yield_top(C, yields)
        return self.yield_nested(levels, C, yields)

    def loop(self, levels: tuple[_Level, ...], C: list[Op], loop: Op, pos: int) -> None:
        """SLoop for `let xs = loop a [sigmas] {e1} in e2`, with e2 = ops[pos + 1:]."""
        # C^: the definitions of C that e1 or e2 use leave C in an execute over the
        # current axes; the others are dead.
        live = [x for op in C for x in op.results if self.last_use.get(x, -1) >= pos]
        if live:
            self.M.update(zip(live, self.execute(levels, C, live), strict=True))
        if levels or self.fragments is None:
            self.loop_body(levels, loop)
            return
        # At top level, the body's translation and the loop's results depend only on the
        # loop and the values it reads from outside (`reused`).
        free = self.fragments.get_or_make(("spmd free values", id(loop)), loop,
                                   lambda: _free_in(loop.regions))

        def make() -> list[Value]:
            self.loop_body(levels, loop)
            return [self.M[x] for x in loop.results]

        self.M.update(zip(loop.results, self.reused(
            (id(loop),), loop, [self.M[z] for z in free], make), strict=True))

    def loop_body(self, levels: tuple[_Level, ...], loop: Op) -> None:
        """SLoop's C^_1 and C^_*: the loop's body and its results' actions."""
        # C^_1: the body, one level deeper, in the empty context, under M_1.
        region = loop.regions[0]
        axis = loop.params["axis"]
        zs = self.translate((*levels, _Level(axis, region.args[0])), region.ops, region.yields)
        # C^_*: sigma |> z ⇓ mu for each result, then e2 is translated under the extended M.
        axes = _axes(levels)
        for x, z, action in zip(loop.results, zs, loop.params["actions"], strict=True):
            self.M[x] = self.act(action, axis, z, DTensorType.of(x.type, axes), x.name or z.name)

    def act(self, action: Action, axis: str, z: Value, mu: DTensorType, name: str | None
            ) -> Value:
        """sigma |> z ⇓ mu: apply the loop action with a tile_reduce, coerce to mu."""
        size = mu.dims[action.dim][1] if isinstance(action, Tile) else None
        key = (id(z.type), axis, id(action), size)
        seen = self.reduced_types.get(key)
        if seen is None:
            seen = self.reduced_types[key] = (
                z.type, action, tile_reduce_type(z.type, axis, action, self.mesh, size))
        t = seen[2]
        reduced = Value(t, name=name)
        self.out.append(make_tile_reduce(z, axis, action, self.mesh, reduced))
        if not isinstance(action, Tile):
            # #sum<a> |> z ⇓ mu: the tile_reduce already has type mu. So does `any<a>`
            # (the paper's Core has no `any`: the iterations agree, any one is the value).
            return reduced
        # #tile<a, d> |> z ⇓ mu: the tiles are now a distributed dimension; redistribute
        # them into mu, whose dimensions are whole on every device of the remaining axes.
        coerced = Value(mu, name=name)
        self.out.append(make_redistribute(reduced, self.mesh, coerced))
        return coerced

    def yield_top(self, C: list[Op], yields: Sequence[Value]) -> list[Value]:
        # SYldTop: C[yield M(x)][M(z)/zs] -- the definitions run at top level on the
        # translations of their free variables. Their results are typed dtensor<{}, [n]>
        # (the paper keeps tau, which is data-equivalent) so that every value outside an
        # execute is a dtensor.
        for op in C:
            self.out.append(_clone(op, self.M, DTensorType.of))
        return [self.M[x] for x in yields]

    def yield_nested(self, levels: tuple[_Level, ...], C: list[Op],
                     yields: Sequence[Value]) -> list[Value]:
        axes = _axes(levels)
        defined = {x for op in C for x in op.results}
        distinct = list(dict.fromkeys(yields))
        local = [x for x in distinct if x in defined]
        outer = [x for x in distinct if x not in defined and self.M[x].type.stacked != axes]
        for x in outer:
            stacked = self.M[x].type.stacked
            assert axes[:len(stacked)] == stacked, f"{x} is stacked on {stacked}, not in {axes}"
        made: dict[Value, Value] = {}
        if local:
            # SYldL: C goes into an execute over the current axes that yields the values
            # it defines; values from outer levels the yield also needs (SYldP) are
            # restacked by the same execute.
            made = dict(zip(local + outer, self.execute(levels, C, local + outer), strict=True))
        elif outer:
            # SYldP: C defines none of the yielded values, so it is dead; an execute of a
            # bare `yield` restacks the outer values on the current axes.
            made = dict(zip(outer, self.execute(levels, [], outer), strict=True))
        # SYldC: a value already stacked on the current axes is yielded as it is.
        return [made[x] if x in made else self.M[x] for x in yields]

    def execute(self, levels: tuple[_Level, ...], C: list[Op], xs: list[Value]) -> list[Value]:
        """`execute axes (M(zs)) (rs, ys) {C[yield xs][ys/zs]}` with zs = FV(C[yield xs])."""
        zs = _free_values(C, xs)
        operands = [self.M[z] for z in zs]
        if levels or self.fragments is None:
            return self.make_execute(levels, C, xs, zs, operands)
        # At top level, an execute depends only on its ops, what it yields and its
        # operands (`reused`).
        return self.reused((len(C), *map(id, C), len(xs), *map(id, xs)), (C, xs), operands,
                           lambda: self.make_execute(levels, C, xs, zs, operands))

    def reused(self, ids: tuple[int, ...], made_of: Any, inputs: list[Value],
               make: Callable[[], list[Value]]) -> list[Value]:
        """The results of the top-level ops that `make` appends, translating the Core ops
        `made_of` (whose ids are `ids`) from the SPMD values `inputs`, taken from
        `fragments` where a function lowered before had the same ops reading values of the
        same types and names. The results are that function's values, so that what reads
        them finds its fragment in turn; where the inputs are other values (of the same
        types: their producers changed), the fragment's ops that read them are rewired to
        these."""
        key = ("spmd", self.mesh_items, *ids, *[id(v.type) for v in inputs],
               *[v.name for v in inputs], *sharing(inputs))
        found = self.fragments.get(key)
        if found is None:
            start = len(self.out)
            results = make()
            self.fragments.put(key, (made_of, [v.type for v in inputs]),
                               [inputs, self.out[start:], results])
            return results
        before, ops, results = found
        if any(a is not b for a, b in zip(before, inputs, strict=True)):
            # Kept rewired: the next function most likely reads these inputs too.
            found[0] = inputs
            found[1] = ops = rewired(ops, before, inputs)
        self.out += ops
        return results

    def make_execute(self, levels: tuple[_Level, ...], C: list[Op], xs: list[Value],
                     zs: list[Value], operands: list[Value]) -> list[Value]:
        axes = _axes(levels)
        ranges = [Value(RangeType(a, self.mesh[a]), name=f"r{a}") for a in axes]
        local_types = self.local_types
        locals_ = []
        for o in operands:
            seen = local_types.get(id(o.type))
            if seen is None:
                seen = local_types[id(o.type)] = (o.type, o.type.local_type(self.mesh))
            locals_.append(Value(seen[1], name=f"y{o.name}" if o.name else None))
        sub: dict[Value, Value] = dict(zip(zs, locals_, strict=True))
        sub.update((lvl.range, r) for lvl, r in zip(levels, ranges, strict=True))
        # The body is C itself but for the free values and ranges, which the execute
        # binds anew: an op reading none of them is kept as it is (IR is never mutated,
        # so the Core function may share it), the others read the substitutes. Results
        # keep their values either way: each is defined once in the SPMD program too.
        body = []
        for op in C:
            if not sub.keys().isdisjoint(op.operands):
                op = Op(op.name, [sub.get(v, v) for v in op.operands], op.results, op.params,
                        op.regions, op.loc, op.prim)
            body.append(op)
        results = [Value(DTensorType.of(x.type, axes), name=x.name) for x in xs]
        self.out.append(make_execute(axes, self.mesh, operands, ranges, locals_, body,
                                     [sub.get(x, x) for x in xs], results))
        return results


def _clone(op: Op, M: dict[Value, Value], result_type: Callable[[Type], Type]) -> Op:
    """op on the translations of its operands, with fresh results of the translated
    types, which M records."""
    results = [Value(result_type(r.type), r.name) for r in op.results]
    for r, new in zip(op.results, results, strict=True):
        M[r] = new
    return Op(op.name, [M[v] for v in op.operands], results, dict(op.params), op.regions,
              op.loc, op.prim)


def _free_in(regions: Sequence[Region]) -> list[Value]:
    """The values the regions' ops (at any depth) and yields read from outside them, in
    order of first use."""
    defined: set[Value] = set()
    free: dict[Value, None] = {}

    def walk(region: Region) -> None:
        defined.update(region.args)
        for op in region.ops:
            for v in op.operands:
                if v not in defined:
                    free[v] = None
            for inner in op.regions:
                walk(inner)
            defined.update(op.results)
        for v in region.yields:
            if v not in defined:
                free[v] = None

    for region in regions:
        walk(region)
    return list(free)


def _free_values(C: list[Op], xs: list[Value]) -> list[Value]:
    """FV(C[yield xs]) in order of first use, without the loop ranges (an execute binds
    its own)."""
    defined: set[Value] = set()
    free: dict[Value, None] = {}
    for op in C:
        for v in op.operands:
            if v not in defined and not isinstance(v.type, RangeType):
                free[v] = None
        defined.update(op.results)
    for x in xs:
        if x not in defined:
            free[x] = None
    return list(free)


def _record_last_uses(ops: Sequence[Op], yields: Sequence[Value], out: dict[Value, int]) -> None:
    """For every x that `ops` define (and, recursively, their regions' ops): out[x] is the
    position of the last op of `ops` using x, len(ops) if yielded. Then x is free in
    `ops[i:]; yield yields` iff out[x] >= i, which is how SLoop tells live definitions.

    One walk over the whole tree: each definition records the depth of the op list
    defining it, and a use at any depth below sets out[x] to the position, at that depth,
    of the op enclosing the use (positions only grow, so the last write is the last use).
    """
    depth_of: dict[Value, int] = {}
    path: list[int] = []  # per depth, the position of the op being walked

    def walk(ops: Sequence[Op], yields: Sequence[Value]) -> None:
        depth = len(path)
        for op in ops:
            for x in op.results:
                depth_of[x] = depth
        path.append(0)
        for i, op in enumerate(ops):
            path[depth] = i
            for v in op.operands:
                d = depth_of.get(v)
                if d is not None:
                    out[v] = path[d]
            for region in op.regions:
                walk(region.ops, region.yields)
        path.pop()
        for v in yields:
            d = depth_of.get(v)
            if d is not None:
                out[v] = len(ops) if d == depth else path[d]

    walk(ops, yields)
