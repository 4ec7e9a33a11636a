"""The mutable Core program that tactics rewrite: ops in program order, each op's loop
nest, and def-use maps. Snapshots (`CoreProgram`) are taken after every tactic."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections import defaultdict

from partir.core.actions import Loop
from partir.core.conflicts import Conflict
from partir.core.program import CoreOp, CoreProgram, Nest
from partir.frontend import TracedProgram
from partir.ir import Location, Value
from partir.mesh import Mesh

_uids = itertools.count()


class CoreModule:
    def __init__(self, traced: TracedProgram, mesh: Mesh) -> None:
        fn = traced.function
        self.mesh = mesh
        self.name = fn.name
        self.args: list[Value] = list(fn.args)
        self.results: list[Value] = list(fn.results)
        self.result_names: list[str] = list(fn.result_names)
        self.tags: dict[str, list[Value]] = {k: list(v) for k, v in traced.tags.items()}
        self.ops: list[CoreOp] = []
        self.by_uid: dict[int, CoreOp] = {}
        self.nests: dict[int, Nest] = {}
        self.producer: dict[Value, tuple[int, int]] = {}
        self.uses: dict[Value, list[tuple[int, int]]] = defaultdict(list)
        self.conflicts: dict[tuple[int, str], Conflict] = {}
        self.acted: dict[tuple[Value, str], str] = {}  # explicit actions, per value and axis
        self._seq = itertools.count(1)
        for idx, op in enumerate(fn.ops):
            cop = CoreOp(next(_uids), op.name, tuple(op.operands), tuple(op.results),
                         op.params, op.loc, op.prim, order=(idx, 0, 0, 0))
            self.ops.append(cop)
            self._index(cop)

    def _index(self, op: CoreOp) -> None:
        self.by_uid[op.uid] = op
        for k, r in enumerate(op.results):
            self.producer[r] = (op.uid, k)
        for i, v in enumerate(op.operands):
            self.uses[v].append((op.uid, i))

    # -- queries -------------------------------------------------------------------------
    def nest(self, uid: int) -> Nest:
        return self.nests.get(uid, ())

    def producer_nest(self, v: Value) -> tuple[Nest, int]:
        p = self.producer.get(v)
        if p is None:
            return (), 0
        return self.nests.get(p[0], ()), p[1]

    def slicing(self, uid: int, i: int) -> tuple[tuple[str, int], ...]:
        """The (axis, dim) slices the op applies to operand i, outermost first."""
        return tuple((lp.axis, lp.operands[i]) for lp in self.nests.get(uid, ())
                     if lp.operands[i] is not None)

    def snapshot(self) -> CoreProgram:
        return CoreProgram(self.name, self.mesh, tuple(self.args), tuple(self.ops),
                           dict(self.nests), tuple(self.results), tuple(self.result_names))

    # -- rewrites ------------------------------------------------------------------------
    def add_loop(self, uid: int, loop: Loop) -> None:
        self.nests[uid] = (*self.nests.get(uid, ()), loop)

    def insert_identity(self, kind: str, value: Value, nest: Nest,
                        uses: list[tuple[int, int]], outputs: list[int],
                        loc: Location) -> CoreOp:
        """Insert `kind` (a `tile` or `atomic` loop) on `value` and make the given uses and
        function outputs read its result instead."""
        p = self.producer.get(value)
        base, sub = (self.by_uid[p[0]].order[0], p[1]) if p else (-1, self.args.index(value))
        result = Value(value.type, name=value.name)
        op = CoreOp(next(_uids), kind, (value,), (result,), {}, loc,
                    order=(base, 1, sub, -next(self._seq)))
        bisect.insort(self.ops, op, key=lambda o: o.order)
        self._index(op)
        self.nests[op.uid] = nest
        for uid, i in uses:
            self._set_operand(uid, i, result)
        for r in outputs:
            self.results[r] = result
        return op

    def _set_operand(self, uid: int, i: int, new: Value) -> None:
        old_op = self.by_uid[uid]
        old = old_op.operands[i]
        operands = list(old_op.operands)
        operands[i] = new
        op = dataclasses.replace(old_op, operands=tuple(operands))
        pos = bisect.bisect_left(self.ops, old_op.order, key=lambda o: o.order)
        while self.ops[pos].uid != uid:
            pos += 1
        self.ops[pos] = op
        self.by_uid[uid] = op
        self.uses[old].remove((uid, i))
        self.uses[new].append((uid, i))
