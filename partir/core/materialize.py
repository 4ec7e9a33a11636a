"""Loop-nest normal form -> explicit PartIR:Core IR (`loop`, `slice`, `tag`).

Consecutive ops over the same axes are fused into one loop nest when each value passed
between them inside the nest is exactly the tile the consumer slices (a `slice` of a
`#tile` loop result over the same range cancels). Value tiling loops whose every use
slices them back are dropped: the uses slice the original value instead, which is what
the paper's listings show "after simplification". Primitives inside loops get the
parameters of their local tile from the TMR.

A primitive whose local computation depends on where its tile lies (its TMR entry has an
`apply`: iota along a tiled dimension, a gather from a sliced table, ...) becomes ordinary
IR: `index` ops give the loop indices as int32 scalars, and the JAX primitives of the
entry's `apply`, traced on the local operand types and one index per loop, compute the
offsets and the tile. Later stages see plain ops and never call back into the TMR. Where
the traced computation is the primitive itself on the local operands (no offset needed),
the single op is emitted as for any other primitive.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
from jax import lax
from jax._src.interpreters import partial_eval as pe
from jax.extend import core as jcore

import partir.cancel as cancel
from partir.core.actions import AnyAction, Sum, Tile
from partir.core.dialect import INDEX_TYPE, make_index, make_loop, make_slice, sliced_type
from partir.core.program import (
    CoreOp,
    CoreProgram,
    Nest,
    divided_type,
    result_local_type,
    tile_dims,
)
from partir.core.regions import BODIES, lower_region, structured
from partir.core.tmr import Entry, LocalContext, OpView, localized, lookup
from partir.frontend import inline_jaxpr
from partir.ir import Function, Op, RangeType, TensorType, Value
from partir.ir.dtypes import canonical
from partir.ir.fragments import Fragments
from partir.ir.monoids import MONOIDS
from partir.ir.opnames import ATOMIC, NAMESPACE, SHARDING_CONSTRAINT, TILE
from partir.ir.types import tile_size

# Identities that compute nothing: where every use slices away the tiles their loops make
# (a model's sharding annotation outside any loop, say), the uses read the operand.
_ELIDED = (TILE, SHARDING_CONSTRAINT)


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
    def __init__(self, prog: CoreProgram, fuse: bool, elide_identities: bool,
                 fragments: Fragments | None) -> None:
        self.prog = prog
        self.mesh = prog.mesh
        # The axis sizes as a plain dict: the local types read them per operand, and a
        # dict lookup is cheaper than the Mesh mapping's.
        self.sizes: dict[str, int] = dict(prog.mesh.items())
        self.fragments = fragments
        # What a loop nest's fragment depends on besides its ops (`_nest_of`).
        self.mesh_items = tuple(self.sizes.items())
        self.nests = prog.nests
        self.fuse = fuse
        self.alias: dict[Value, Value] = {}
        # The results of tile loops nothing reads, which the loops yield all the same.
        self.unread: list[Value] = []
        # TMR entries by op name, looked up once per name rather than once per op.
        self.entries: dict[str, Entry] = {}
        # (ids of an op's result types, ids of its nest's loops) -> `_local_types`: they
        # depend on nothing else, and the ops of repeated layers share both (a type per
        # shape from the frontend, the loops of propagation's shared decisions), so each
        # is worked out once per layer's op, not per op. Types and loops are distinct
        # objects, so the ids cannot be confused; the program keeps them all alive for
        # the run, so their ids stay theirs.
        self.local_types: dict[tuple, _LocalTypes] = {}
        if elide_identities:
            self._elide_identities()

    def resolve(self, v: Value) -> Value:
        alias = self.alias
        while v in alias:
            v = alias[v]
        return v

    def _elide_identities(self) -> None:
        outputs = set(self.prog.results)
        candidates = [op for op in self.prog.ops
                      if op.name in _ELIDED and op.results[0] not in outputs]
        # Only the uses of the candidates' results are needed.
        uses: dict[Value, list[tuple[CoreOp, int]]] = {op.results[0]: [] for op in candidates}
        for op in self.prog.ops:
            for i, v in enumerate(op.operands):
                u = uses.get(v)
                if u is not None:
                    u.append((op, i))
        for op in candidates:
            nest = self.prog.nest(op)
            users = uses.get(op.results[0])
            if not users:
                # A tile loop nothing reads stays, yielding its tiles: it is how an input
                # the function ignores is laid out as a tactic asked (the lowering makes
                # the slices of its tiles the input's sharding).
                self.unread.append(op.results[0])
            elif all(_cancels(nest, self.prog.nest(c), i) for c, i in users):
                self.alias[op.results[0]] = op.operands[0]

    def _fusible(self, group: _Group, op: CoreOp, nest: Nest) -> bool:
        produced, alias, nests = group.produced, self.alias, self.nests
        for i, v in enumerate(op.operands):
            while v in alias:
                v = alias[v]
            src = produced.get(v)
            if src is None:
                continue
            p, k = src
            for plp, clp in zip(nests.get(p.uid, ()), nest, strict=True):
                a, d = plp.results[k], clp.operands[i]
                if not ((isinstance(a, Tile) and d == a.dim)
                        or (isinstance(a, AnyAction) and d is None)):
                    return False
        return True

    def groups(self) -> list[_Group]:
        # Unlooped constants depend on nothing: hoisting them keeps loop nests contiguous.
        hoisted = _Group(())
        out: list[_Group] = [hoisted]
        alias, nests = self.alias, self.nests
        for op in self.prog.ops:
            if op.results and op.results[0] in alias:
                continue
            nest = nests.get(op.uid, ())
            if not nest and not op.operands:
                hoisted.ops.append(op)
                hoisted.produced.update((r, (op, k)) for k, r in enumerate(op.results))
                continue
            axes = tuple([lp.axis for lp in nest])
            if not (self.fuse and out and axes and out[-1].axes == axes and not out[-1].closed
                    and op.name != ATOMIC and self._fusible(out[-1], op, nest)):
                out.append(_Group(axes, closed=op.name == ATOMIC))
            group = out[-1]
            group.ops.append(op)
            for k, r in enumerate(op.results):
                group.produced[r] = (op, k)
        return out

    def run(self) -> Function:
        prog = self.prog
        groups = self.groups()
        used_outside: set[Value] = {self.resolve(v) for v in prog.results}
        used_outside.update(self.unread)
        owner: dict[Value, int] = {}
        for gi, g in enumerate(groups):
            for v in g.produced:
                owner[v] = gi
        alias = self.alias
        for gi, g in enumerate(groups):
            for op in g.ops:
                for v in op.operands:
                    while v in alias:  # self.resolve, inlined for the many operands
                        v = alias[v]
                    if owner.get(v, gi) != gi:
                        used_outside.add(v)
        ops: list[Op] = []
        token = cancel.current()
        for g in groups:
            if token is not None and token.cancelled:
                token.check()
            if not g.ops:
                continue
            if not g.axes:
                for op in g.ops:
                    ops.append(self._unlooped(op))
            else:
                ops.append(self._nest_of(g, [v for v in g.produced if v in used_outside]))
        fn = Function(prog.name, list(prog.args), ops, [self.resolve(v) for v in prog.results],
                      list(prog.result_names))
        fn.attributes["mesh"] = str(prog.mesh)
        for key, constraints in (("out_constraints", prog.out_constraints),
                                 ("in_constraints", prog.in_constraints)):
            if any(c is not None for c in constraints):
                # In the program's axes: a user's axis split into sub-axes is all of them.
                fn.attributes[key] = tuple(
                    None if c is None else
                    tuple(tuple(p for a in axes for p in prog.mesh.parts(a)) for axes in c)
                    for c in constraints)
        return fn

    def _unlooped(self, op: CoreOp) -> Op:
        operands = [self.resolve(v) for v in op.operands]

        def make() -> Op:
            programs = op.params.get(BODIES)
            if programs is not None:
                return _control_op(op, operands, list(op.results), programs)
            return Op(op.name, operands, list(op.results), op.params, [], op.loc, op.prim)

        if self.fragments is None:
            return make()
        return self.fragments.get_or_make(("materialize", id(op), *map(id, operands)),
                                   (op, operands), make)

    def _nest_of(self, g: _Group, escaping: list[Value]) -> Op:
        """The loop nest of group `g`, from `fragments` where an earlier program had the
        same group: the same ops in the same loops, reading the same values (aliases
        resolved), with the same results used outside it, on the same mesh."""
        fragments = self.fragments
        if fragments is None:
            return self._loop_nest(g, escaping)
        nests, resolve = self.nests, self.resolve
        loops = [nests[op.uid] for op in g.ops]
        operands = [resolve(v) for op in g.ops for v in op.operands]
        key = ("materialize", self.mesh_items, len(g.ops), *map(id, g.ops), *map(id, loops),
               *map(id, operands), *map(id, escaping))
        return fragments.get_or_make(key, (g.ops, loops, operands, escaping),
                              lambda: self._loop_nest(g, escaping))

    def _loop_nest(self, g: _Group, escaping: list[Value]) -> Op:
        ranges = [Value(RangeType(a, self.mesh[a]), name=f"r{a}") for a in g.axes]
        depth = len(g.axes)
        sizes = [self.sizes[a] for a in g.axes]  # per level, read per sliced operand
        alias, nests = self.alias, self.nests
        inner: dict[Value, Value] = {}
        sliced: dict[tuple[Value, tuple], Value] = {}
        indices: list[Value | None] = [None] * depth  # per level, its `index` once made
        body: list[Op] = []
        local_types = self.local_types
        for op in g.ops:
            nest = nests[op.uid]  # in a group over axes, every op has its loops
            key = (*[id(r.type) for r in op.results], *[id(lp) for lp in nest])
            local = local_types.get(key)
            if local is None:
                local = local_types[key] = _local_types(op, nest, sizes)
            operand_dims = local[0]
            operands = []
            for i, v in enumerate(op.operands):
                while v in alias:
                    v = alias[v]
                cur = inner.get(v)
                if cur is not None:
                    operands.append(cur)
                    continue
                dims = operand_dims[i]
                cur = sliced.get((v, dims))
                if cur is None:
                    cur = v
                    for lvl, d in enumerate(dims):
                        if d is not None:
                            nxt = Value(sliced_type(cur.type, d, sizes[lvl]))
                            body.append(make_slice(cur, d, ranges[lvl], nxt))
                            cur = nxt
                    sliced[(v, dims)] = cur
                operands.append(cur)
            if op.is_identity:
                inner[op.results[0]] = operands[0]
                continue
            results = self._local_op(op, nest, local, sizes, operands, ranges, indices, body)
            for r, lr in zip(op.results, results, strict=True):
                inner[r] = lr
        # build the nest from the innermost loop outwards
        yields = [inner[v] for v in escaping]
        for lvl in range(depth - 1, -1, -1):
            actions = []
            results = []
            for v in escaping:
                p, k = g.produced[v]
                p_nest = nests.get(p.uid, ())
                actions.append(p_nest[lvl].results[k])
                results.append(v if lvl == 0 else
                               Value(result_local_type(p, p_nest, k, self.sizes, lvl)))
            loop = make_loop(g.axes[lvl], self.mesh[g.axes[lvl]], tuple(actions), body, yields,
                             results, ranges[lvl])
            body, yields = [loop], results
        return body[0]

    def _local_op(self, op: CoreOp, nest: Nest, local: _LocalTypes, sizes: list[int],
                  operands: list[Value], ranges: list[Value], indices: list[Value | None],
                  body: list[Op]) -> list[Value]:
        """Append op's local computation to `body`; its results."""
        operand_dims, out_types, sums = local
        programs = op.params.get(BODIES)
        if programs is not None:  # its regions lower as programs of their own
            results = [Value(t, name=r.name) for t, r in zip(out_types, op.results, strict=True)]
            body.append(_control_op(op, operands, results, programs))
            return results
        entry = self.entries.get(op.name)
        if entry is None:
            entry = self.entries[op.name] = lookup(op.name)
        if sums:
            operands = self._mask_padding(op, nest, operand_dims, sizes, operands, ranges,
                                          indices, body)
        if entry.localize is None:
            # What `localized` returns then, without building the view it would not read
            # (most primitives keep their parameters), and shared: IR is never mutated.
            params = op.params
        else:
            in_types = tuple([divided_type(v.type, dims, sizes)
                              for v, dims in zip(op.operands, operand_dims, strict=True)])
            params = localized(entry, OpView(op.name, op.params, in_types, out_types))
        traced = None
        if entry.apply is not None:
            traced = self._traced(op, entry, params, nest, tuple([v.type for v in operands]),
                                  out_types)
        if traced is None:
            results = [Value(t, name=r.name) for t, r in zip(out_types, op.results, strict=True)]
            body.append(Op(op.name, operands, results, params, [], op.loc, op.prim))
            return results
        closed, levels = traced
        for lvl in levels:
            if indices[lvl] is None:
                made = make_index(ranges[lvl], name=f"i{ranges[lvl].type.axis}")
                body.append(made)
                indices[lvl] = made.results[0]
        ops, results = _inline_tile(op, closed, [*operands, *[indices[lvl] for lvl in levels]],
                                    out_types)
        body.extend(ops)
        return results

    def _mask_padding(self, op: CoreOp, nest: Nest,
                      operand_dims: Sequence[tuple[int | None, ...]],
                      sizes: list[int], operands: list[Value], ranges: list[Value],
                      indices: list[Value | None], body: list[Op]) -> list[Value]:
        """The operands, with the padding of every dimension a `#sum` loop of the nest
        slices replaced by the neutral element of the loop's monoid.

        A tile of a padded dimension holds arbitrary values past the dimension's end; a
        loop over a pass-through factor only computes arbitrary values there in turn (the
        loop's #tile result drops them), but a #sum loop would combine them into the
        result. Each operand's position along the dimension is its tile's offset (from
        the loop indices) plus an iota; positions past the end are masked."""
        out = list(operands)
        for lvl, lp in enumerate(nest):
            monoid = next((a.monoid for a in lp.results if type(a) is Sum), None)
            if monoid is None:
                continue
            for i, v in enumerate(op.operands):
                d = operand_dims[i][lvl] if operand_dims[i] else None
                if d is None:
                    continue
                # The dimension's size where this level slices it (its parent tile's),
                # and the tile sizes of this level and of those inside it: a position in
                # the parent tile is their offsets plus an iota. Outer levels only say
                # which parent tile this is (any level may pad: each #sum level masks
                # its own padding).
                size, steps, before = v.type.shape[d], [], None
                for level, (dim, n) in enumerate(zip(operand_dims[i], sizes, strict=True)):
                    if dim == d:
                        if level == lvl:
                            before = size
                        size = tile_size(size, n)
                        if level >= lvl:
                            steps.append((level, size))
                if before is None or before % sizes[lvl] == 0:
                    continue
                closed = _mask_jaxpr(out[i].type, d, before, tuple(s for _, s in steps),
                                     MONOIDS[monoid].identity(out[i].type.dtype).item())
                levels = [level for level, _ in steps]
                for level in levels:
                    if indices[level] is None:
                        made = make_index(ranges[level], name=f"i{ranges[level].type.axis}")
                        body.append(made)
                        indices[level] = made.results[0]
                ops, (masked,) = inline_jaxpr(closed, [out[i], *[indices[level]
                                                                 for level in levels]], op.loc)
                body.extend(ops)
                for o in ops:
                    for r in o.results:
                        r.name = "pad_mask" if r is masked else o.name
                out[i] = masked
        return out

    def _traced(self, op: CoreOp, entry: Entry, params: dict[str, Any], nest: Nest,
                in_types: tuple, out_types: tuple) -> tuple[Any, tuple[int, ...]] | None:
        """The entry's `apply` traced on the local operands and the loop indices: the
        closed jaxpr taking the operands and the indices of `levels` (the loop levels it
        reads), or None when it is the primitive itself with `params` on the operands."""
        sig = op.signature
        key = None
        if sig is not None:
            # The signature holds the global types the offsets are computed from, and the
            # offsets scale with the loops' axis sizes: the local types do not tell them
            # (8 on axes of 4 then 2, or of 2 then 4, has tiles of 1 either way).
            key = (sig, in_types, out_types, nest, tuple([self.sizes[lp.axis] for lp in nest]),
                   jax.config.jax_enable_x64, jax.config.jax_threefry_partitionable)
            found = _TRACES.get(key, _MISSING)
            if found is not _MISSING:
                return found
        traced = _trace_apply(op, entry, params, nest, in_types, out_types, self.sizes)
        if key is not None:
            if len(_TRACES) >= _MAX_TRACES:
                _TRACES.clear()
            _TRACES[key] = traced
        return traced


def _inline_tile(op: Op, closed: Any, args: list[Value], out_types: Sequence[TensorType]
                 ) -> tuple[list[Op], list[Value]]:
    """The ops of an op's traced local computation on `args`, and its results, typed and
    named as the op's tile."""
    ops, results = inline_jaxpr(closed, args, op.loc)
    produced = {v for o in ops for v in o.results}
    for v, t, r in zip(results, out_types, op.results, strict=True):
        # A declared 64-bit type is what JAX traces in 32 bits when x64 is off.
        if v not in produced or v.type.shape != t.shape or (
                canonical(v.type.dtype) != canonical(t.dtype)):
            raise AssertionError(f"the local computation of {op.name} at {op.loc} gives "
                                 f"{v.type}, its tile is {t}")
        v.type, v.name = t, r.name
    # The intermediate values are named after their primitives (`%mul`, `%mul_1`...;
    # partir's own ops by their printed word, `%constant`): the printer numbers only the
    # results, as it would the single op's.
    outputs = set(results)
    for o in ops:
        for v in o.results:
            if v not in outputs:
                v.name = o.name.removeprefix(NAMESPACE)
    return ops, results


# Per operand, the dimension each loop level slices (None: whole); the results' tile types
# (result_local_type, from those of each level); whether a loop sums.
_LocalTypes = tuple[tuple[tuple[int | None, ...], ...], tuple[TensorType, ...], bool]


def _local_types(op: CoreOp, nest: Nest, sizes: list[int]) -> _LocalTypes:
    return (tuple(zip(*[lp.operands for lp in nest], strict=True)),
            tuple([divided_type(r.type, tile_dims(nest, k), sizes)
                   for k, r in enumerate(op.results)]),
            any(type(a) is Sum for lp in nest for a in lp.results))


# Traced local computations of index-dependent ops, shared by the repeated layers of a model
# and by the materializations after each tactic.
_TRACES: dict[tuple, Any] = {}
_MAX_TRACES = 4096
_MISSING = object()


@functools.lru_cache(maxsize=1024)
def _mask_jaxpr(t: TensorType, dim: int, size: int, steps: tuple[int, ...],
                identity: Any) -> Any:
    """The closed jaxpr (x, one index per step) -> x with the positions of `dim` at or
    past `size` set to `identity`; `steps` are the tile sizes of the padded level and of
    the levels inside it slicing dim, outermost first, so the tile's offset in the padded
    level's parent tile is the sum of index * step."""

    def mask(x: Any, *index: Any) -> Any:
        offset = index[0] * steps[0]
        for i, step in zip(index[1:], steps[1:], strict=True):
            offset = offset + i * step
        position = lax.broadcasted_iota(INDEX_TYPE.dtype, x.shape, dim) + offset
        return lax.select(position < size, x, lax.full_like(x, identity))

    avals = [jax.ShapeDtypeStruct(t.shape, t.dtype)]
    avals += [jax.ShapeDtypeStruct((), INDEX_TYPE.dtype)] * len(steps)
    return jax.make_jaxpr(mask)(*avals)


def _trace_apply(op: CoreOp, entry: Entry, params: dict[str, Any], nest: Nest,
                 in_types: Sequence[TensorType], out_types: Sequence[TensorType],
                 sizes: dict[str, int]) -> tuple[Any, tuple[int, ...]] | None:
    n = len(in_types)
    level_of = {lp.axis: lvl for lvl, lp in enumerate(nest)}
    view = OpView(op.name, params, tuple(in_types), tuple(out_types))
    global_in = tuple([v.type for v in op.operands])
    global_out = tuple([v.type for v in op.results])

    def local(*args: Any) -> list[Any]:
        index = args[n:]
        ctx = LocalContext(nest, global_in, global_out,
                           index=lambda axis: index[level_of[axis]],
                           axis_size=sizes.__getitem__)
        return list(entry.apply(view, op.prim, list(args[:n]), ctx))

    avals = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in in_types]
    avals += [jax.ShapeDtypeStruct((), INDEX_TYPE.dtype)] * len(nest)
    closed = jax.make_jaxpr(local)(*avals)
    jaxpr, used = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    # Every operand stays an input, read or not; of the indices only those it reads.
    levels = tuple(lvl for lvl in range(len(nest)) if used[n + lvl])
    invars = closed.jaxpr.invars
    jaxpr = jaxpr.replace(invars=[*invars[:n], *[invars[n + lvl] for lvl in levels]])
    if _is_primitive(op, jaxpr, n):
        return None
    return jcore.ClosedJaxpr(jaxpr, closed.consts), levels


def _is_primitive(op: CoreOp, jaxpr: Any, n: int) -> bool:
    """Is the jaxpr op's primitive applied to its n operands in order (or, for a
    constant, the constant itself)?"""
    if op.prim is None:
        return (not jaxpr.eqns and len(jaxpr.outvars) == 1
                and jaxpr.outvars[0] in jaxpr.constvars)
    if len(jaxpr.eqns) != 1:
        return False
    (eqn,) = jaxpr.eqns
    return (eqn.primitive is op.prim and list(eqn.invars) == list(jaxpr.invars)
            and list(eqn.outvars) == list(jaxpr.outvars))


def _control_op(op: CoreOp, operands: list[Value], results: list[Value],
                programs: Sequence[CoreProgram]) -> Op:
    """A restructured control-flow op, its regions its region programs lowered."""
    return Op(op.name, operands, results, {k: v for k, v in op.params.items() if k != BODIES},
              [lower_region(p) for p in programs], op.loc, op.prim)


def materialize(prog: CoreProgram, fuse: bool = True, elide_identities: bool = True,
                fragments: Fragments | None = None) -> Function:
    """`fragments`: the loop nests (and unlooped ops) of programs materialized before,
    reused where this program has the same (`partir.ir.fragments`)."""
    return _Materializer(structured(prog), fuse, elide_identities, fragments).run()
