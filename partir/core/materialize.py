"""Loop-nest normal form -> explicit PartIR:Core IR (`loop`, `slice`, `tag`).

Consecutive ops over the same axes are fused into one loop nest when each value passed
between them inside the nest is exactly the tile the consumer slices (a `slice` of a
`#tile` loop result over the same range cancels). Value tiling loops whose every use
slices them back are dropped: the uses slice the original value instead, which is what
the paper's listings show "after simplification". Primitives inside loops get the
parameters of their local tile from the TMR; those whose local computation depends on
the loop index read the ranges as extra operands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from partir.core.actions import AnyAction, Tile
from partir.core.dialect import make_loop, make_slice, sliced_type
from partir.core.program import (
    CoreOp,
    CoreProgram,
    Nest,
    operand_local_type,
    result_local_type,
)
from partir.core.tmr import OpView, localized_params, lookup
from partir.ir import Function, Op, RangeType, Value


def _cancels(identity_nest: Nest, consumer_nest: Nest, i: int) -> bool:
    """Does use i of the consumer slice away every tile of the identity loop nest?"""
    tiles: dict[int, list[str]] = {}
    for lp in identity_nest:
        a = lp.results[0]
        if not isinstance(a, Tile):
            return False
        tiles.setdefault(a.dim, []).append(lp.axis)
    slices: dict[int, list[str]] = {}
    for lp in consumer_nest:
        if lp.operands[i] is not None:
            slices.setdefault(lp.operands[i], []).append(lp.axis)
    return all(slices.get(d, [])[:len(t)] == t for d, t in tiles.items())


@dataclass
class _Group:
    axes: tuple[str, ...]
    ops: list[CoreOp] = field(default_factory=list)
    produced: dict[Value, tuple[CoreOp, int]] = field(default_factory=dict)
    closed: bool = False  # an `atomic` loop stands alone, as the barrier the user asked for


class _Materializer:
    def __init__(self, prog: CoreProgram, fuse: bool, elide_identities: bool) -> None:
        self.prog = prog
        self.mesh = prog.mesh
        self.fuse = fuse
        self.alias: dict[Value, Value] = {}
        if elide_identities:
            self._elide_identities()

    def resolve(self, v: Value) -> Value:
        while v in self.alias:
            v = self.alias[v]
        return v

    def _elide_identities(self) -> None:
        uses: dict[Value, list[tuple[CoreOp, int]]] = {}
        for op in self.prog.ops:
            for i, v in enumerate(op.operands):
                uses.setdefault(v, []).append((op, i))
        outputs = set(self.prog.results)
        for op in self.prog.ops:
            if op.name != "tile" or op.results[0] in outputs:
                continue
            nest = self.prog.nest(op)
            if all(_cancels(nest, self.prog.nest(c), i) for c, i in uses.get(op.results[0], ())):
                self.alias[op.results[0]] = op.operands[0]

    def _fusible(self, group: _Group, op: CoreOp, nest: Nest) -> bool:
        for i, v in enumerate(op.operands):
            src = group.produced.get(self.resolve(v))
            if src is None:
                continue
            p, k = src
            for plp, clp in zip(self.prog.nest(p), nest, strict=True):
                a, d = plp.results[k], clp.operands[i]
                if not ((isinstance(a, Tile) and d == a.dim)
                        or (isinstance(a, AnyAction) and d is None)):
                    return False
        return True

    def groups(self) -> list[_Group]:
        # Unlooped constants depend on nothing: hoisting them keeps loop nests contiguous.
        hoisted = _Group(())
        out: list[_Group] = [hoisted]
        for op in self.prog.ops:
            if op.results and op.results[0] in self.alias:
                continue
            nest = self.prog.nest(op)
            if not nest and not op.operands:
                hoisted.ops.append(op)
                hoisted.produced.update((r, (op, k)) for k, r in enumerate(op.results))
                continue
            axes = tuple(lp.axis for lp in nest)
            if not (self.fuse and out and axes and out[-1].axes == axes and not out[-1].closed
                    and op.name != "atomic" and self._fusible(out[-1], op, nest)):
                out.append(_Group(axes, closed=op.name == "atomic"))
            group = out[-1]
            group.ops.append(op)
            for k, r in enumerate(op.results):
                group.produced[r] = (op, k)
        return out

    def run(self) -> Function:
        prog = self.prog
        groups = self.groups()
        used_outside: set[Value] = {self.resolve(v) for v in prog.results}
        owner: dict[Value, int] = {}
        for gi, g in enumerate(groups):
            for v in g.produced:
                owner[v] = gi
        for gi, g in enumerate(groups):
            for op in g.ops:
                for v in op.operands:
                    v = self.resolve(v)
                    if owner.get(v, gi) != gi:
                        used_outside.add(v)
        ops: list[Op] = []
        for g in groups:
            if not g.ops:
                continue
            if not g.axes:
                for op in g.ops:
                    ops.append(Op(op.name, [self.resolve(v) for v in op.operands],
                                  list(op.results), dict(op.params), loc=op.loc, prim=op.prim))
            else:
                ops.append(self._loop_nest(g, [v for v in g.produced if v in used_outside]))
        fn = Function(prog.name, list(prog.args), ops, [self.resolve(v) for v in prog.results],
                      list(prog.result_names))
        fn.attributes["mesh"] = str(prog.mesh)
        return fn

    def _loop_nest(self, g: _Group, escaping: list[Value]) -> Op:
        ranges = [Value(RangeType(a, self.mesh[a]), name=f"r{a}") for a in g.axes]
        depth = len(g.axes)
        inner: dict[Value, Value] = {}
        sliced: dict[tuple[Value, tuple], Value] = {}
        body: list[Op] = []
        for op in g.ops:
            nest = self.prog.nest(op)
            operands = []
            for i, v in enumerate(op.operands):
                v = self.resolve(v)
                if v in inner:
                    operands.append(inner[v])
                    continue
                dims = tuple(lp.operands[i] for lp in nest)
                cur = sliced.get((v, dims))
                if cur is None:
                    cur = v
                    for lvl, d in enumerate(dims):
                        if d is not None:
                            nxt = Value(sliced_type(cur.type, d, self.mesh[g.axes[lvl]]))
                            body.append(make_slice(cur, d, ranges[lvl], nxt))
                            cur = nxt
                    sliced[(v, dims)] = cur
                operands.append(cur)
            if op.is_identity:
                inner[op.results[0]] = operands[0]
                continue
            local = self._local_op(op, nest, operands, ranges)
            body.append(local)
            for r, lr in zip(op.results, local.results, strict=True):
                inner[r] = lr
        # build the nest from the innermost loop outwards
        yields = [inner[v] for v in escaping]
        for lvl in range(depth - 1, -1, -1):
            actions = []
            results = []
            for v in escaping:
                p, k = g.produced[v]
                actions.append(self.prog.nest(p)[lvl].results[k])
                results.append(v if lvl == 0 else
                               Value(result_local_type(p, self.prog.nest(p), k, self.mesh, lvl)))
            loop = make_loop(g.axes[lvl], self.mesh[g.axes[lvl]], tuple(actions), body, yields,
                             results, ranges[lvl])
            body, yields = [loop], results
        return body[0]

    def _local_op(self, op: CoreOp, nest: Nest, operands: list[Value],
                  ranges: list[Value]) -> Op:
        mesh = self.mesh
        in_types = tuple(operand_local_type(op, nest, i, mesh) for i in range(len(op.operands)))
        out_types = tuple(result_local_type(op, nest, k, mesh) for k in range(len(op.results)))
        entry = lookup(op.name)
        params = localized_params(entry, OpView(op.name, op.params, in_types, out_types))
        results = [Value(t, name=r.name) for t, r in zip(out_types, op.results, strict=True)]
        if entry.apply is not None:
            params["_loops"] = nest
            params["_global_types"] = (tuple(v.type for v in op.operands),
                                       tuple(v.type for v in op.results))
            operands = [*operands, *ranges]
        return Op(op.name, operands, results, params, loc=op.loc, prim=op.prim)


def materialize(prog: CoreProgram, fuse: bool = True, elide_identities: bool = True) -> Function:
    return _Materializer(prog, fuse, elide_identities).run()
