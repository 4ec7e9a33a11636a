"""The mutable Core program that tactics rewrite: ops in program order, each op's loop
nest, and def-use maps. Snapshots (`CoreProgram`) are taken after every tactic."""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import defaultdict

from partir.core.actions import AnyAction, Loop, Tile
from partir.core.conflicts import Conflict
from partir.core.program import CoreOp, CoreProgram, Nest
from partir.core.regions import flat_ops
from partir.frontend import TracedProgram
from partir.ir import Location, Value
from partir.mesh import Mesh

_uids = itertools.count()


class NestInfo:
    """An op's loop nest indexed for propagation: loops by axis, and per result (operand)
    the tiling (slicing) axes of each dim, major to minor."""

    __slots__ = ("loops", "replicated", "slices", "tiles")

    def __init__(self, nest: Nest, n_operands: int, n_results: int) -> None:
        self.loops: dict[str, Loop] = {}
        self.tiles: list[dict[int, list[str]]] = [{} for _ in range(n_results)]
        self.replicated: list[list[str]] = [[] for _ in range(n_results)]
        self.slices: list[dict[int, list[str]]] = [{} for _ in range(n_operands)]
        for lp in nest:
            self._add(lp)

    def _add(self, lp: Loop) -> None:
        """Index one more (inner) loop. Replaces, never mutates, the per-dim dicts and
        lists it changes: `extended` shares the others with the index it copies."""
        self.loops[lp.axis] = lp
        for k, a in enumerate(lp.results):
            if type(a) is Tile:
                tiles = self.tiles[k] = dict(self.tiles[k])
                tiles[a.dim] = [*tiles.get(a.dim, ()), lp.axis]
            elif type(a) is AnyAction and not a.barrier:
                self.replicated[k] = [*self.replicated[k], lp.axis]
        for i, d in enumerate(lp.operands):
            if d is not None:
                slices = self.slices[i] = dict(self.slices[i])
                slices[d] = [*slices.get(d, ()), lp.axis]

    def extended(self, lp: Loop) -> NestInfo:
        """The index of this nest with one more (inner) loop; this one is left as is,
        since snapshots and other ops may share it."""
        new = NestInfo.__new__(NestInfo)
        new.loops = dict(self.loops)
        new.tiles = list(self.tiles)
        new.replicated = list(self.replicated)
        new.slices = list(self.slices)
        new._add(lp)
        return new


@functools.cache
def _unlooped(n_operands: int, n_results: int) -> NestInfo:
    """The (shared, never mutated) index of an empty nest."""
    return NestInfo((), n_operands, n_results)


class CoreModule:
    def __init__(self, traced: TracedProgram, mesh: Mesh) -> None:
        fn = traced.function
        self.mesh = mesh
        self.name = fn.name
        self.args: list[Value] = list(fn.args)
        # Where each argument is, for ordering the identity ops on arguments (a model's
        # arguments are its parameters and optimizer state: a search per op would scan
        # thousands).
        self._arg_position: dict[Value, int] = {v: i for i, v in
                                                reversed(list(enumerate(self.args)))}
        self.results: list[Value] = list(fn.results)
        self.result_names: list[str] = list(fn.result_names)
        # Per output, the exact sharding `out_shardings` asks for (per dim, the user's
        # mesh axes major to minor), or None: the lowering returns it laid out so.
        self.out_constraints: list[tuple[tuple[str, ...], ...] | None] = \
            [None] * len(self.results)
        self.tags: dict[str, list[Value]] = {k: list(v) for k, v in traced.tags.items()}
        # What tactics read of the model besides its values: its inputs' pytree, its
        # sharding annotations (never rewritten, so shared by forks).
        self.traced = traced
        self.ops: list[CoreOp] = []
        self.by_uid: dict[int, CoreOp] = {}
        self.nests: dict[int, Nest] = {}
        self.producer: dict[Value, tuple[int, int]] = {}
        self.uses: dict[Value, list[tuple[int, int]]] = defaultdict(list)
        # The values whose use lists this module changes in place; None: every value's.
        # A fork shares its parent's lists, and each copies a list before it first changes
        # it (`_own_uses`): copying every list cost a 200-tactic schedule's each tactic
        # as much as propagating it, though a tactic rewires few uses.
        self._owned_uses: set[Value] | None = None
        self.conflicts: dict[tuple[int, str], Conflict] = {}
        # The uids of the ops rewrites inserted, rewired or gave another nest since the
        # module was made or forked: what a state's program changed from its parent's.
        self.changed: set[int] = set()
        self.acted: dict[tuple[Value, str], str] = {}  # explicit actions, per value and axis
        self.splits: list[str] = []  # why each axis split into sub-axes was made
        self.notes: list[str] = []  # what propagation chose that a user should know
        self._seq = 1  # the last part of the next identity op's `order`
        self.info: dict[int, NestInfo] = {}  # every op's nest, indexed
        # (id(info), id(loop)) -> (info, loop, info.extended(loop)): the ops of repeated
        # layers start from the same empty nest's index and gain the same Loop objects
        # (propagation's decisions are shared), so they share one index per nest instead
        # of each copying it, and propagation can memoise on the indices' identity. The
        # entry holds both keys' objects, so their ids are not reused while it exists.
        self._extended: dict[tuple[int, int], tuple[NestInfo, Loop, NestInfo]] = {}
        self._shared_nests: dict[tuple[Nest, int, int], tuple[Nest, NestInfo]] = {}
        self._output_index: dict[Value, list[int]] = defaultdict(list)
        # The order a value is available after, where it is not its producer's: a loop's
        # carried result, made by the carry's edge op before the body, exists after it.
        self._available: dict[Value, tuple[int, ...]] = {}
        for r, v in enumerate(self.results):
            self._output_index[v].append(r)
        for f in flat_ops(fn.ops):
            cop = CoreOp(next(_uids), f.name, f.operands, f.results, f.params, f.loc, f.prim,
                         order=f.order)
            self.ops.append(cop)
            self._index(cop)
            if f.available:
                for r, at in zip(f.results, f.available, strict=True):
                    if at is not None:
                        self._available[r] = at
        # The ops' `order`s, in the same order: bisected for each inserted op and rewired
        # use as plain tuples, without a key call per step (reading `order` from ops
        # spread over the heap cost ~8 us per bisection of a model's ops).
        self._orders: list[tuple[int, ...]] = [op.order for op in self.ops]

    def _index(self, op: CoreOp) -> None:
        self.by_uid[op.uid] = op
        if op.uid not in self.info:  # (an inserted op has its nest's: `_set_nest`)
            self.info[op.uid] = _unlooped(len(op.operands), len(op.results))
        for k, r in enumerate(op.results):
            self.producer[r] = (op.uid, k)
        for i, v in enumerate(op.operands):
            self._own_uses(v).append((op.uid, i))

    def _own_uses(self, v: Value) -> list[tuple[int, int]]:
        """v's use list, this module's own to change."""
        owned = self._owned_uses
        if owned is None or v in owned:
            return self.uses[v]
        owned.add(v)
        own = self.uses[v] = list(self.uses.get(v, ()))
        return own

    def _set_nest(self, op: CoreOp, nest: Nest) -> None:
        """Give op a nest made whole (by an action or an axis split) and
        its index, both shared by every op given an equal nest (Loops compare by value)
        with as many operands and results, as `add_loop` shares those it extends: the
        values of repeated layers get equal actions, each made of new Loops, and the
        memos on the indices' and loops' identities (propagation's, materialize's,
        `add_loop`'s) then serve them all."""
        self.changed.add(op.uid)
        key = (nest, len(op.operands), len(op.results))
        shared = self._shared_nests.get(key)
        if shared is None:
            shared = self._shared_nests[key] = (
                nest, NestInfo(nest, len(op.operands), len(op.results)))
        self.nests[op.uid], self.info[op.uid] = shared

    # -- queries -------------------------------------------------------------------------
    def nest(self, uid: int) -> Nest:
        return self.nests.get(uid, ())

    def output_positions(self, v: Value) -> list[int]:
        return self._output_index.get(v, [])

    def slicing(self, uid: int, i: int) -> tuple[tuple[str, int], ...]:
        """The (axis, dim) slices the op applies to operand i, outermost first."""
        return tuple((lp.axis, lp.operands[i]) for lp in self.nests.get(uid, ())
                     if lp.operands[i] is not None)

    def snapshot(self) -> CoreProgram:
        return CoreProgram(self.name, self.mesh, tuple(self.args), tuple(self.ops),
                           dict(self.nests), tuple(self.results), tuple(self.result_names),
                           tuple(self.out_constraints))

    def fork(self) -> CoreModule:
        """An independent copy to continue rewriting from this state (the daemon resumes
        an edited schedule from the state after the last unchanged tactic). Ops, values,
        nests and `NestInfo`s are never mutated in place, so they are shared; every
        container a rewrite mutates is copied, the per-value use lists when first
        changed (by either module)."""
        new = CoreModule.__new__(CoreModule)
        new.mesh = self.mesh
        new.name = self.name
        new.args = list(self.args)
        new._arg_position = self._arg_position  # never changes, as the arguments do not
        new.results = list(self.results)
        new.result_names = list(self.result_names)
        new.out_constraints = list(self.out_constraints)
        new.tags = {k: list(v) for k, v in self.tags.items()}
        new.traced = self.traced
        new.ops = list(self.ops)
        new._orders = list(self._orders)
        new.by_uid = dict(self.by_uid)
        new.nests = dict(self.nests)
        new.producer = dict(self.producer)
        new.uses = defaultdict(list, self.uses)
        new._owned_uses = set()
        self._owned_uses = set()  # the fork shares them now
        new.conflicts = dict(self.conflicts)
        new.changed = set()
        new.acted = dict(self.acted)
        new.splits = list(self.splits)
        new.notes = list(self.notes)
        new._seq = self._seq
        new.info = dict(self.info)
        new._extended = {}  # a memo: the fork rebuilds its own, bounded by its own loops
        new._shared_nests = {}  # likewise (see `_set_nest`)
        new._available = self._available  # never changes after construction
        new._output_index = defaultdict(list, {v: list(r) for v, r in
                                               self._output_index.items()})
        return new

    # -- rewrites ------------------------------------------------------------------------
    def refine_axis(self, axis: str, sizes: tuple[int, ...], why: str) -> list[int]:
        """Split mesh axis `axis` into sub-axes of the given sizes (`Mesh.refine`) in the
        whole program: every loop over it becomes the loops over its sub-axes, major to
        minor, with the same actions, which tile and slice the same data. Returns the ops
        whose conflicts on the axis were dropped, to be propagated again."""
        self.mesh = self.mesh.refine(axis, sizes)
        parts = self.mesh.parts(axis)
        self.splits.append(f"axis {axis!r} split into sub-axes {', '.join(parts)} {why}")
        for uid, nest in self.nests.items():
            if any(lp.axis == axis for lp in nest):
                new = tuple(sub for lp in nest for sub in
                            ((Loop(a, lp.results, lp.operands) for a in parts)
                             if lp.axis == axis else (lp,)))
                self._set_nest(self.by_uid[uid], new)
        self.acted = {(v, a): what for (v, ax), what in self.acted.items()
                      for a in (parts if ax == axis else (ax,))}
        dropped = [uid for uid, ax in self.conflicts if ax == axis]
        for uid in dropped:
            del self.conflicts[(uid, axis)]
        return dropped

    def add_loop(self, uid: int, loop: Loop) -> None:
        self.changed.add(uid)
        self.nests[uid] = (*self.nests.get(uid, ()), loop)
        info = self.info[uid]
        key = (id(info), id(loop))
        hit = self._extended.get(key)
        if hit is None:
            hit = self._extended[key] = (info, loop, info.extended(loop))
        self.info[uid] = hit[2]

    def insert_identity(self, kind: str, value: Value, nest: Nest,
                        uses: list[tuple[int, int]], outputs: list[int],
                        loc: Location) -> CoreOp:
        """Insert `kind` (a `tile` or `atomic` loop) on `value` and make the given uses and
        function outputs read its result instead."""
        p = self.producer.get(value)
        # right after the value's definition: its producer, or the arguments before all ops
        after = self._available.get(value) or (
            (*self.by_uid[p[0]].order, p[1]) if p else (-1, self._arg_position[value]))
        result = Value(value.type, name=value.name)
        op = CoreOp(next(_uids), kind, (value,), (result,), {}, loc,
                    order=(*after, self._seq))
        self._seq += 1
        pos = bisect.bisect_right(self._orders, op.order)
        self.ops.insert(pos, op)
        self._orders.insert(pos, op.order)
        self._set_nest(op, nest)
        self._index(op)
        for uid, i in uses:
            self._set_operand(uid, i, result)
        for r in outputs:
            self.results[r] = result
            self._output_index[value].remove(r)
            self._output_index[result].append(r)
        return op

    def _set_operand(self, uid: int, i: int, new: Value) -> None:
        old_op = self.by_uid[uid]
        old = old_op.operands[i]
        op = old_op.with_operand(i, new)
        self.changed.add(uid)
        pos = bisect.bisect_left(self._orders, old_op.order)
        while self.ops[pos].uid != uid:
            pos += 1
        self.ops[pos] = op
        self.by_uid[uid] = op
        self._own_uses(old).remove((uid, i))
        self._own_uses(new).append((uid, i))
