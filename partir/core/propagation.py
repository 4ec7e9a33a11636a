"""Propagation: greedily extend loop nests through the program using the TMR.

For an op and a mesh axis it is not yet looped over:
- forward: an operand whose producer tiles it on that axis (beyond the slicing the op
  already applies) supports the TMR mappings that slice that operand the same way;
- backward: a result that every slicing use slices on that axis supports the mappings
  that tile it that way;
- inference: a supported mapping that also slices operands nobody tiled is taken as is,
  slicing them (and later propagating backward into their producers).
A single supported mapping without contradiction is applied: the op gains a loop over
the axis. A mapping that reads whole an operand tiled on a dimension it tiles the result
from (a concatenate along the tiled dimension: the loop gathers the operand, then cuts
its tile out) is supported by that tiling only once propagation has reached a fixpoint
without such mappings. Several, or only contradicted ones, is a conflict: propagation
stops at that op and the conflict is recorded. There is no cost model; ops are visited
in program order from a worklist, so results are deterministic.

The multi-axis analysis of appendix B is the per-dimension comparison of a value's tiling
axes (major to minor) with the slicing axes of a use: only the next axis after the common
prefix can be adopted, so a tiled-then-sliced value is recognised through nests and
slice chains alike.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
from collections.abc import Callable
from typing import NamedTuple

import partir.cancel as cancel
from partir.core.actions import AnyAction, Loop, Sum, Tile
from partir.core.conflicts import (
    AXIS_IN_SCOPE,
    INDIVISIBLE,
    MULTIPLE_MATCHES,
    NEEDS_REPLICATION,
    REPLICATED_OPERAND,
    SHIFTED_TILES,
    UNSUPPORTED,
    Conflict,
)
from partir.core.module import CoreModule, NestInfo
from partir.core.program import CoreOp
from partir.core.tmr import Entry, TileMapping, factor_mappings, lookup
from partir.gcpause import paused_gc
from partir.ir import Value
from partir.ir.monoids import MONOIDS
from partir.ir.types import tile_size
from partir.rules import REPLICATION, ShardingRule
from partir.rules.edges import EXIT, written_name
from partir.rules.unsupported import why_unsupported


class _Excess(NamedTuple):
    adopt: dict[str, int]  # axis -> dim the op could loop over next
    pinned: tuple[str, ...] = ()  # axes on which the value must stay replicated
    in_scope: tuple[tuple[str, int], ...] = ()  # (axis, dim) blocked by an enclosing loop
    deeper: bool = False  # after adopting an axis, a further one would follow on that dim


_NONE = _Excess({})
_uid = operator.attrgetter("uid")
# Builds an _Excess from a tuple without the Python-level __new__ of NamedTuple: the
# excesses are computed for every use of every value propagation reaches.
_excess = functools.partial(tuple.__new__, _Excess)


def _frontier(ahead: dict[int, list[str]], behind: dict[int, list[str]]
              ) -> tuple[list[tuple[str, int]], bool]:
    """Per dim, the next axis of `ahead` after `behind`, when `behind` is a prefix of it,
    and whether any dim has more axes after that one.

    A value tiled over (a, b) on a dim and sliced by a use over (a) can be looped over b
    next; tiled over (b) but sliced over (a) is misaligned and gives nothing."""
    out = []
    deeper = False
    for d, axes in ahead.items():
        have = behind.get(d)
        n = len(have) if have else 0
        if len(axes) > n and (not n or axes[:n] == have):
            out.append((axes[n], d))
            deeper = deeper or len(axes) > n + 1
    return out, deeper


def operand_excess(producer: NestInfo, k: int, consumer: NestInfo, i: int) -> _Excess:
    """Tiling of a value (result k of its producer) beyond what use i of the consumer
    slices away."""
    tiles = producer.tiles[k]
    replicated = producer.replicated[k]
    slices = consumer.slices[i]
    # The common case, a value used exactly as it is tiled, leaves nothing to adopt.
    if not replicated and (not tiles or tiles == slices):
        return _NONE
    adopt: dict[str, int] = {}
    in_scope = []
    frontier, deeper = _frontier(tiles, slices)
    loops = consumer.loops
    for axis, d in frontier:
        lp = loops.get(axis)
        if lp is None:
            adopt[axis] = d
        elif lp.operands[i] is None and (
                not all(type(a) is AnyAction for a in lp.results)
                or any(at is not None for at in lp.operands)):
            # (a loop replicating the op, all `any` and slicing nothing, keeps it whole)
            in_scope.append((axis, d))
    pinned = tuple(a for a in replicated if a not in loops) if replicated else ()
    return _excess((adopt, pinned, tuple(in_scope), deeper))


def use_excess(producer: NestInfo, k: int, consumer: NestInfo, i: int) -> _Excess:
    """Slicing of a value by use i of a consumer beyond what its producer tiles."""
    slices = consumer.slices[i]
    if not slices or slices == producer.tiles[k]:
        return _NONE
    adopt: dict[str, int] = {}
    in_scope = []
    frontier, deeper = _frontier(consumer.slices[i], producer.tiles[k])
    for axis, d in frontier:
        lp = producer.loops.get(axis)
        if lp is None:
            adopt[axis] = d
        elif type(lp.results[k]) is Sum:
            in_scope.append((axis, d))
    return _excess((adopt, (), tuple(in_scope), deeper))


def _unsliceable(rule: ShardingRule, sizes: tuple[int, ...], operand_dims: list[int | None],
                 result_dims: list[int | None]) -> tuple[str, tuple[str, ...], str] | tuple[()]:
    """Why no factor of the requested dimensions can be sliced, as a conflict, or () when
    the request names no factor (a size-1 dim JAX broadcasts)."""
    majors = rule.majors(sizes)
    reasons = []
    for what, dims_of, wanted in (("operand", rule.operands, operand_dims),
                                  ("result", rule.results, result_dims)):
        for i, d in enumerate(wanted):
            if d is None:
                continue
            live = [f for f in dims_of[i][d] if sizes[f] != 1]
            if not live:
                continue
            factor = rule.factors[live[0]]
            if factor.kind == REPLICATION:
                reasons.append(f"dimension {d} of {what} {i} needs replication" +
                               (f": {factor.why}" if factor.why else ""))
            elif live[0] not in majors:
                reasons.append(f"dimension {d} of {what} {i} would be sliced on a minor "
                               f"part of a dimension the op splits or merges")
    if not reasons:
        return ()
    return NEEDS_REPLICATION, (), "; ".join(reasons)


def _match(m: TileMapping, operand_dims: list[int | None], pinned: set[int],
           result_dims: list[int | None], gather: bool = True) -> tuple[bool, bool, bool]:
    """Whether the mapping slices some requested dimension as requested (support),
    slices one otherwise (contradiction), or slices an operand kept replicated."""
    support = contra = replicated = False
    for i, d in enumerate(operand_dims):
        if d is not None:
            if m.operands[i] == d or (gather and m.gathers(i, d)):
                support = True
            else:
                contra = True
        elif i in pinned and m.operands[i] is not None:
            replicated = True
    for k, d in enumerate(result_dims):
        if d is not None:
            if m.results[k] == Tile(d):
                support = True
            else:
                contra = True
    return support, contra, replicated


# A decision to wait: the request is supported only by mappings that gather a tiled
# operand (`TileMapping.whole`), which are taken once propagation has settled without them.
_DEFER = ("defer",)


class _Refine(NamedTuple):
    """A decision to split the requested axis into sub-axes of these sizes first."""

    sizes: tuple[int, ...]


def _sub_axes(rule: ShardingRule, sizes: tuple[int, ...], n: int,
              operand_dims: list[int | None], pinned: set[int],
              result_dims: list[int | None]) -> tuple[int, ...] | None:
    """Sizes of sub-axes, major to minor, that an axis of size n would split into so that
    each is the only mapping the request supports and divides its factor: e.g. a dim of
    8 tiled on an axis of 4, reshaped to 2x4, gives (2, 2), the first sub-axis tiling the
    2 and the second the 4. None when no such split exists (or it is the axis itself)."""
    local = list(sizes)
    parts: list[int] = []
    while n > 1:
        found = [(f, m) for f, m in factor_mappings(rule, local)
                 if _match(m, operand_dims, pinned, result_dims) == (True, False, False)]
        if len(found) != 1:
            return None
        f = found[0][0]
        k = math.gcd(local[f], n)
        if k == 1:
            return None
        parts.append(k)
        local[f] //= k
        n //= k
    return tuple(parts) if len(parts) > 1 else None


def padding_refusal(entry: Entry, rule: ShardingRule, f: int, op: CoreOp,
                    size: int | None = None) -> str:
    """Why factor f, which the axis does not divide, cannot be padded ("" if it can):
    every dimension holding it must hold no other factor of size > 1 (a reshape merging
    or splitting a padded dimension would mix the padding into the data). A factor
    earlier axes tiled (`size`: its local size, if not whole) may pad: the loop pads each
    of their tiles, and a `#sum` level masks the padding of the tiles it splits
    (`materialize._mask_padding`); not at a control-flow op's edge (`pads_tiles`), whose
    regions' arguments and yields are laid out as SPMD types, padded on a dimension's
    major axis only."""
    factor = rule.factors[f]
    if not entry.primitive.pads_tiles and size is not None and size != factor.size:
        return (f"the {written_name(op)} at {op.loc} carries the factor of size {factor.size} into "
                f"or out of its regions already tiled by other axes (tiles of {size}), "
                f"where only the first axis tiling it may pad it")
    for what, dims_of in (("operand", rule.operands), ("result", rule.results)):
        for i, dims in enumerate(dims_of):
            for d, factors in enumerate(dims):
                if f in factors and any(g != f and rule.factors[g].size > 1 for g in factors):
                    return (f"dimension {d} of {what} {i} merges the factor of size "
                            f"{factor.size} with others (a reshape of a padded dimension)")
    if factor.monoid is not None:
        for i, dims in enumerate(rule.operands):
            if any(f in factors for factors in dims):
                try:
                    MONOIDS[factor.monoid].identity(op.operands[i].type.dtype)
                except ValueError as e:
                    return f"no neutral element to mask the padding with: {e}"
    return ""


class Propagator:
    def __init__(self, module: CoreModule, pad: bool = False) -> None:
        self.m = module
        # Whether a factor the axis does not divide may be padded (see `padding_refusal`).
        self.pad = pad
        self.axes = list(module.mesh.axis_names)
        self.sizes = dict(module.mesh)
        # The worklist holds positions in the program: ints compare faster than the ops'
        # `order` tuples, and propagation inserts no ops, so positions stay valid. Made
        # at the first push: a tactic that changes nothing pushes nothing.
        self._position: dict[int, int] | None = None
        self._queue: list[int] = []
        self._queued: set[int] = set()
        # request -> the loop to add (Loop) or the conflict to record (kind, choices,
        # detail) or nothing (())
        self._decisions: dict[tuple, Loop | _Refine | tuple] = {}
        self._refined = False
        # (signature, id(NestInfo), request) -> (the NestInfo, decision): see `_choose`.
        # Local shapes also depend on the axes' sizes, so an axis split clears it.
        self._by_nest: dict[tuple, tuple[NestInfo, Loop | _Refine | tuple]] = {}
        # (id(producer's NestInfo), result, id(consumer's NestInfo), operand) ->
        # (the two NestInfos, excess), for `operand_excess` and `use_excess`: an excess
        # reads nothing but the two indices, which are never mutated (a new loop or an
        # axis split makes new ones) and which the ops of repeated layers share
        # (`CoreModule.add_loop`), so each pair is worked out once per propagation, not
        # per use and visit. The entry holds the NestInfos, so their ids are not reused.
        self._operand_ex: dict[tuple[int, int, int, int],
                               tuple[NestInfo, NestInfo, _Excess]] = {}
        self._use_ex: dict[tuple[int, int, int, int],
                           tuple[NestInfo, NestInfo, _Excess]] = {}
        # `_step_key` -> `_step`'s outcome: a look at an op reads nothing but its
        # signature, its nest's index and its neighbours', and the ops of repeated layers
        # meet the same ones, so a look that recorded no conflict (whose text names the
        # op) is replayed: its loop added and the neighbours it woke woken again, without
        # working out the excesses, the choice and the wake-ups again. An axis split
        # changes the choices (as for `_by_nest`), so it clears them.
        self._steps: dict[tuple, tuple] = {}
        self._conflicts_made = 0  # conflicts recorded so far (a look's are not replayed)
        self._woken: tuple = ((), ())  # the last `_apply`'s `_wake`, for `_step`
        # Whether mappings that gather a tiled operand (a concatenate along a tiled dim)
        # may be chosen: only after the fixpoint without them, so that they never
        # pre-empt a tiling the tactic's own actions reach (a Megatron weight downstream),
        # and the ops that waited for them.
        self._late = False
        self._deferred: list[int] = []

    # -- worklist ------------------------------------------------------------------------
    def push(self, uid: int) -> None:
        if uid not in self._queued:
            self._queued.add(uid)
            position = self._position
            if position is None:
                position = self._position = dict(zip(map(_uid, self.m.ops),
                                                     itertools.count()))
            heapq.heappush(self._queue, position[uid])

    def run(self) -> None:
        token = cancel.current()  # checked every 256 visits: cancelled within ~ms
        visits = 0
        while True:
            while self._queue:
                visits += 1
                if not visits & 255 and token is not None:
                    token.check()
                uid = self.m.ops[heapq.heappop(self._queue)].uid
                self._queued.discard(uid)
                self._visit(uid)
            if self._late or not self._deferred:
                return
            self._late = True
            for uid in self._deferred:
                self.push(uid)

    # -- one op --------------------------------------------------------------------------
    def _visit(self, uid: int) -> None:
        m = self.m
        while True:
            op = m.by_uid[uid]
            info = m.info[uid]
            key = self._step_key(op, info)
            seen = self._steps.get(key) if key is not None else None
            if seen is not None:
                loop, woken, again = seen
                if loop is not None:
                    self._apply(op, loop, woken)
            else:
                conflicts = self._conflicts_made
                step = self._step(op, info)
                if step is None:
                    continue  # look at the op again with the wider loop or the split axis
                if key is not None and self._conflicts_made == conflicts:
                    self._steps[key] = step
                again = step[2]
            if not again:
                return

    def _step_key(self, op: CoreOp, info: NestInfo) -> tuple | None:
        """What a look at the op depends on (see `_steps`): its signature, its nest's
        index and its neighbours' (each operand's producer and result, each result's uses
        and their operand), by position. None without a signature."""
        sig = op.signature
        if sig is None or op.name == EXIT:  # an exit's look reads its yield's other uses
            return None
        producers, infos, uses = self.m.producer, self.m.info, self.m.uses
        # Flat (a tuple of tuples hashes each of them): per operand its producer's index
        # and result (None, None without one), per result the number of its uses, then
        # each use's index and operand. The op's index has one entry per operand and per
        # result, so the layout of two keys with one index is the same. NestInfos hash
        # and compare by identity, and the key holds them, so their ids are not reused.
        key: list = [sig, info, self._late]
        for v in op.operands:
            p = producers.get(v)
            if p is None:
                key += (None, None)
            else:
                key += (infos[p[0]], p[1])
        for r in op.results:
            used = uses.get(r, ())
            key.append(len(used))
            for cuid, i in used:
                key += (infos[cuid], i)
        return tuple(key)

    def _step(self, op: CoreOp, info: NestInfo) -> tuple | None:
        """One look at the op: the loop it gained (None: none), the neighbours that woke
        (`_wake`'s positions) and whether to look again; or None when a loop was widened
        or the axes split (look again, as it is now)."""
        operand_ex = self._operand_excesses(op, info)
        result_ex = self._result_excesses(op, info)
        candidates: set[str] = set()
        deeper = in_scope = False
        for ex in operand_ex:
            if ex is not None:
                candidates.update(ex.adopt)
                deeper = deeper or ex.deeper
                in_scope = in_scope or bool(ex.in_scope)
        for uses in result_ex:
            for ex in uses:
                if ex is not _NONE:
                    candidates.update(ex.adopt)
                    deeper = deeper or ex.deeper
                    in_scope = in_scope or bool(ex.in_scope)
        if in_scope:
            self._record_in_scope(op, operand_ex, result_ex)
        for axis in self.axes:
            if axis in candidates and (self._forward(op, axis, operand_ex)
                                       or self._backward(op, axis, operand_ex, result_ex)):
                break
        else:
            return None, None, False
        if self._refined:  # the axes changed: look at the op again under their names
            self._refined = False
            return None
        # A new loop only opens more work here if another axis was on offer or a value is
        # tiled (sliced) deeper than the axis just adopted.
        return self.m.nests[op.uid][-1], self._woken, len(candidates) > 1 or deeper

    def _operand_excesses(self, op: CoreOp, info: NestInfo) -> list[_Excess | None]:
        producers, infos, memo = self.m.producer, self.m.info, self._operand_ex
        out: list[_Excess | None] = []
        for i, v in enumerate(op.operands):
            p = producers.get(v)
            pinfo = infos[p[0]] if p is not None else None
            if pinfo is None or not pinfo.loops:
                out.append(None)
                continue
            # `_operand_excess` with its memo hit inlined: once per operand per visit.
            seen = memo.get((id(pinfo), p[1], id(info), i))
            ex = seen[2] if seen is not None else self._operand_excess(pinfo, p[1], info, i)
            if ex.adopt and op.name == EXIT:
                ex = self._kept_whole(op, v, ex)
            out.append(ex)
        return out

    def _kept_whole(self, op: CoreOp, value: Value, ex: _Excess) -> _Excess:
        """The excess of a yield at its exit edge less the axes along which another use
        in the body reads it whole: the body gathers it there anyway, so it leaves the
        region gathered, and the regions reading the op's result read it whole too,
        rather than each gathering it again (as one value's uses share its gather in
        unrolled code: a scan's residual of a ZeRO-sharded weight, read by its backward)."""
        infos = self.m.info
        whole = set()
        for cuid, j in self.m.uses.get(value, ()):
            if cuid == op.uid:
                continue
            loops = infos[cuid].loops
            whole.update(a for a in ex.adopt if a in loops and loops[a].operands[j] is None)
        if not whole:
            return ex
        return ex._replace(adopt={a: d for a, d in ex.adopt.items() if a not in whole})

    def _operand_excess(self, pinfo: NestInfo, k: int, info: NestInfo, i: int) -> _Excess:
        """`operand_excess`, remembered (see `_operand_ex`)."""
        return _remembered(self._operand_ex, operand_excess, pinfo, k, info, i)

    def _use_excess(self, pinfo: NestInfo, k: int, info: NestInfo, i: int) -> _Excess:
        """`use_excess`, remembered (see `_operand_ex`)."""
        return _remembered(self._use_ex, use_excess, pinfo, k, info, i)

    def _result_excesses(self, op: CoreOp, info: NestInfo) -> list[list[_Excess]]:
        uses, infos, memo = self.m.uses, self.m.info, self._use_ex
        out: list[list[_Excess]] = []
        me = id(info)
        for k, r in enumerate(op.results):
            row = []
            for cuid, i in uses.get(r, ()):
                # `_use_excess` with its memo hit inlined: once per use per visit.
                cinfo = infos[cuid]
                seen = memo.get((me, k, id(cinfo), i))
                row.append(seen[2] if seen is not None else self._use_excess(info, k, cinfo, i))
            out.append(row)
        return out

    def _local_shapes(self, op: CoreOp, info: NestInfo) -> tuple[tuple, tuple]:
        # Indexed rather than zipped: the NestInfo has one entry per operand (result).
        divide = self._divide
        slices, tiles = info.slices, info.tiles
        return (tuple([divide(v.type.shape, slices[i]) if slices[i] else v.type.shape
                       for i, v in enumerate(op.operands)]),
                tuple([divide(v.type.shape, tiles[k]) if tiles[k] else v.type.shape
                       for k, v in enumerate(op.results)]))

    def _divide(self, shape: tuple[int, ...], axes_by_dim: dict[int, list[str]]
                ) -> tuple[int, ...]:
        local = list(shape)
        sizes = self.sizes
        for d, axes in axes_by_dim.items():
            for a in axes:
                local[d] = tile_size(local[d], sizes[a])
        return tuple(local)

    def _choose(self, op: CoreOp, axis: str, operand_dims: list[int | None],
                pinned: set[int], result_dims: list[int | None]) -> bool:
        entry = lookup(op.name)
        if entry is None:
            # the reason the catalogue gives, shown with the conflict
            self._conflict(op, axis, UNSUPPORTED, (), why_unsupported(op.name))
            return False
        info = self.m.info[op.uid]
        # Decisions depend only on the op's kind, parameters and types, its local shapes
        # and the request; the layers of a model repeat them, so they are remembered.
        kind = op.signature
        request = (tuple(operand_dims), tuple(sorted(pinned)) if pinned else (),
                   tuple(result_dims), axis, self._late)
        # The local shapes are those of the types (in `kind`) divided as the nest says,
        # and the ops of repeated layers share their nests' indices: a decision is first
        # looked up by the index itself, without dividing the shapes again.
        by_nest = None if kind is None else (kind, id(info), request)
        seen = self._by_nest.get(by_nest) if by_nest is not None else None
        if seen is not None:
            decision = seen[1]
        else:
            in_shapes, out_shapes = self._local_shapes(op, info)
            key = None if kind is None else (kind, in_shapes, out_shapes, *request)
            decision = self._decisions.get(key) if key is not None else None
            if decision is None:
                decision = self._decide(entry, op, in_shapes, out_shapes, axis, operand_dims,
                                        pinned, result_dims)
                if key is not None:
                    self._decisions[key] = decision
            if by_nest is not None:
                self._by_nest[by_nest] = (info, decision)  # info: its id stays its own
        if type(decision) is Loop:
            if self._late:
                self._note_gathers(op, decision, operand_dims)
            self._apply(op, decision)
            return True
        if type(decision) is _Refine:
            self._refine(op, axis, decision.sizes)
            return True
        if decision is _DEFER:
            self._deferred.append(op.uid)
            return False
        if decision:
            self._conflict(op, axis, *decision)
        return False

    def _note_gathers(self, op: CoreOp, loop: Loop, operand_dims: list[int | None]) -> None:
        """Say which collective each operand of a loop that reads a tiled operand whole
        (a concatenate along its tiled dimension) gets, as GSPMD's partitioner does."""
        gathered = [i for i, d in enumerate(operand_dims)
                    if d is not None and loop.operands[i] is None]
        if not gathered:
            return
        parts = [f"operand {i}{f' (%{v.name})' if v.name else ''} "
                 + (f"all_gather<{loop.axis}>" if i in gathered else
                    "sliced locally" if loop.operands[i] is not None else "cut out locally")
                 for i, v in enumerate(op.operands)]
        self.m.notes.append(f"{op.name} at {op.loc.file}:{op.loc.line} keeps its result "
                            f"tiled on {loop.axis!r} along a dimension an operand is tiled "
                            f"on: {', '.join(parts)}")

    def _decide(self, entry: Entry, op: CoreOp, in_shapes: tuple, out_shapes: tuple,
                axis: str, operand_dims: list[int | None], pinned: set[int],
                result_dims: list[int | None]
                ) -> Loop | _Refine | tuple[str, tuple[str, ...], str] | tuple[()]:
        """The loop to add, the axis split to make first, or the conflict (kind, choices,
        detail), or ()."""
        n = self.sizes[axis]
        rule = entry.rule(op.view())
        sizes = rule.local_sizes(in_shapes, out_shapes)
        candidates, contested, indivisible, held = [], [], [], []
        gathering = False
        for f, m in factor_mappings(rule, sizes):
            support, contra, replicated = _match(m, operand_dims, pinned, result_dims,
                                                 self._late)
            if not support:
                if not self._late and _match(m, operand_dims, pinned, result_dims)[0]:
                    gathering = True
                continue
            if sizes[f] % n and (not self.pad or
                                 padding_refusal(entry, rule, f, op, sizes[f])):
                indivisible.append(m)
            elif contra:
                contested.append(m)
            elif replicated:
                held.append(m)
            else:
                candidates.append(m)
        if len(candidates) == 1:
            return Loop(axis, candidates[0].results, candidates[0].operands)
        if gathering and not (candidates or contested or held or indivisible):
            return _DEFER
        if held and not candidates and not contested:
            return (REPLICATED_OPERAND, tuple(str(m) for m in held),
                    "the mapping would slice an operand kept replicated (atomic) on this axis")
        if candidates or contested or held:
            return MULTIPLE_MATCHES, tuple(str(m) for m in [*candidates, *contested, *held]), ""
        if indivisible:
            parts = _sub_axes(rule, sizes, n, operand_dims, pinned, result_dims)
            if parts:
                return _Refine(parts)
            detail = (f"axis size {n} does not divide the dimensions of {in_shapes} -> "
                      f"{out_shapes}, and no split of the axis into sub-axes (each dividing "
                      f"the factor it would tile, major to minor) exists")
            if self.pad:
                why = {padding_refusal(entry, rule, f, op, sizes[f])
                       for f, m in factor_mappings(rule, sizes) if m in indivisible}
                why.discard("")
                if why:
                    detail += "; cannot pad: " + "; ".join(sorted(why))
            return INDIVISIBLE, tuple(str(m) for m in indivisible), detail
        return _unsliceable(rule, sizes, operand_dims, result_dims)

    def _forward(self, op: CoreOp, axis: str,
                 operand_ex: list[_Excess | None]) -> bool:
        dims = [ex.adopt.get(axis) if ex else None for ex in operand_ex]
        if dims.count(None) == len(dims):
            return False
        return self._choose(op, axis, dims, self._pinned(operand_ex, axis),
                            [None] * len(op.results))

    @staticmethod
    def _pinned(operand_ex: list[_Excess | None], axis: str) -> set[int]:
        """The operands kept replicated on the axis."""
        return {i for i, ex in enumerate(operand_ex) if ex and axis in ex.pinned}

    def _backward(self, op: CoreOp, axis: str, operand_ex: list[_Excess | None],
                  result_ex: list[list[_Excess]]) -> bool:
        dims: list[int | None] = []
        for k, uses in enumerate(result_ex):
            wanted = {ex.adopt[axis] for ex in uses if axis in ex.adopt}
            if len(wanted) > 1:
                self._conflict(op, axis, MULTIPLE_MATCHES,
                               tuple(f"result {k} sliced on dim {d}" for d in sorted(wanted)),
                               "uses slice the result differently")
                return False
            dims.append(wanted.pop() if wanted else None)
        if dims.count(None) == len(dims):
            return False
        return self._choose(op, axis, [None] * len(op.operands),
                            self._pinned(operand_ex, axis), dims)

    def _refine(self, op: CoreOp, axis: str, sizes: tuple[int, ...]) -> None:
        """Split the axis into sub-axes throughout the program, then carry on with them."""
        why = f"to shard through {op.name} at {op.loc}"
        for uid in self.m.refine_axis(axis, sizes, why):
            self.push(uid)
        self.axes = list(self.m.mesh.axis_names)
        self.sizes = dict(self.m.mesh)
        self._by_nest.clear()
        self._steps.clear()
        self._refined = True

    def _record_in_scope(self, op: CoreOp, operand_ex: list[_Excess | None],
                         result_ex: list[list[_Excess]]) -> None:
        nest = self.m.nest(op.uid)
        gathered = None
        for i, ex in enumerate(operand_ex):
            for axis, d in ex.in_scope if ex else ():
                lp = next(lp for lp in nest if lp.axis == axis)
                if gathered is None:
                    gathered = _gathered(op)
                if any(m.gathers(i, d) and lp.operands[i] is None and all(
                        a == b for a, b in zip(m.results, lp.results, strict=True)
                        if type(a) is Tile) for m in gathered):
                    continue  # the loop tiles a factor read from it whole: no conflict
                self._conflict(op, axis, AXIS_IN_SCOPE,
                               (f"loop {axis!r} [{', '.join(map(str, lp.results))}]",
                                f"operand {i} tiled #tile<{d}>"),
                               "the op is already inside a loop over this axis")
        for k, uses in enumerate(result_ex):
            for ex in uses:
                for axis, d in ex.in_scope:
                    lp = next(lp for lp in nest if lp.axis == axis)
                    self._conflict(op, axis, AXIS_IN_SCOPE,
                                   (f"loop {axis!r} [{lp.results[k]}]",
                                    f"result {k} sliced on dim {d}"),
                                   "the op is already inside a loop over this axis")

    def _conflict(self, op: CoreOp, axis: str, kind: str, choices: tuple[str, ...],
                  detail: str = "") -> None:
        self._conflicts_made += 1
        if kind == NEEDS_REPLICATION and _shifts(self.m, op):
            kind = SHIFTED_TILES
        self.m.conflicts.setdefault((op.uid, axis), Conflict(
            kind, written_name(op), op.loc, axis, choices, detail))

    def _apply(self, op: CoreOp, loop: Loop,
               woken: tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None = None) -> None:
        """Add the loop, then revisit the neighbours for which it changes something: the
        producers of operands it slices and the users of the results it tiles. A replayed
        look (`_steps`) passes those its first time found (`_wake`'s positions)."""
        m = self.m
        m.add_loop(op.uid, loop)
        m.conflicts.pop((op.uid, loop.axis), None)
        if woken is None:
            self._woken = self._wake(op, loop)
            return
        for i in woken[0]:
            self.push(m.producer[op.operands[i]][0])
        for k, j in woken[1]:
            self.push(m.uses[op.results[k]][j][0])

    def _wake(self, op: CoreOp, loop: Loop
              ) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """Revisit the neighbours for which the op's new loop changes something; which, by
        position: the operands whose producers, and the (result, use) pairs."""
        m = self.m
        info = m.info[op.uid]
        operands, uses = [], []
        for i, v in enumerate(op.operands):
            if loop.operands[i] is not None:
                p = m.producer.get(v)
                if p is not None:
                    ex = self._use_excess(m.info[p[0]], p[1], info, i)
                    if ex.adopt or ex.in_scope:
                        self.push(p[0])
                        operands.append(i)
        for k, r in enumerate(op.results):
            for j, (uid, i) in enumerate(m.uses.get(r, ())):
                ex = self._operand_excess(info, k, m.info[uid], i)
                if ex.adopt or ex.in_scope or ex.pinned:
                    self.push(uid)
                    uses.append((k, j))
        return tuple(operands), tuple(uses)


def _shifts(m: CoreModule, op: CoreOp) -> bool:
    """Whether op is a slice of x along one dimension that every reader concatenates
    along it with other slices of x making up all of x (a roll of the dimension)."""
    if op.name != "slice" or op.params.get("strides") not in (None, (1,) * len(
            op.params["start_indices"])):
        return False
    (x,) = op.operands
    cut = [d for d, (a, b, n) in enumerate(zip(op.params["start_indices"],
                                               op.params["limit_indices"], x.type.shape,
                                               strict=True)) if (a, b) != (0, n)]
    if len(cut) != 1:
        return False
    (d,) = cut
    readers = [m.by_uid[uid] for uid, _ in m.uses.get(op.results[0], ())]
    if not readers:
        return False
    for reader in readers:
        if reader.name != "concatenate" or reader.params["dimension"] != d:
            return False
        pieces = []
        for v in reader.operands:
            p = m.producer.get(v)
            piece = m.by_uid[p[0]] if p is not None else None
            if piece is None or piece.name != "slice" or piece.operands[0] is not x:
                return False
            pieces.append((piece.params["start_indices"][d], piece.params["limit_indices"][d]))
        ordered = sorted(pieces)
        whole = ordered[0][0] == 0 and ordered[-1][1] == x.type.shape[d] and all(
            a == end for (a, _), (_, end) in zip(ordered[1:], ordered, strict=False))
        if not whole or pieces == ordered:  # not all of x, or x as it is
            return False
    return True


def _gathered(op: CoreOp) -> list[TileMapping]:
    """The op's mappings that read an operand whole where their factor is one of its
    dims (`Factor.whole`): a loop of one gathers a tiled operand as it should."""
    entry = lookup(op.name)
    if entry is None:
        return []
    rule = entry.rule(op.view())
    return [m for _, m in factor_mappings(rule, rule.sizes) if m.whole]


def _remembered(memo: dict, excess: Callable[[NestInfo, int, NestInfo, int], _Excess],
                pinfo: NestInfo, k: int, info: NestInfo, i: int) -> _Excess:
    """excess(pinfo, k, info, i), kept in `memo` by the nest indices' identities (with
    the indices, so that they stay alive and their ids are not reused)."""
    key = (id(pinfo), k, id(info), i)
    seen = memo.get(key)
    if seen is not None:
        return seen[2]
    ex = excess(pinfo, k, info, i)
    memo[key] = (pinfo, info, ex)
    return ex


def propagate(module: CoreModule, seeds, pad: bool = False) -> None:
    """Propagate from the ops in `seeds` (uids) to a fixpoint. With `pad`, an op may be
    looped over an axis that does not divide the factor it slices (padding it)."""
    p = Propagator(module, pad)
    for uid in seeds:
        p.push(uid)
    with paused_gc():
        p.run()
