"""GPipe as a rewrite of a scan over layers (`partir.PipelinePartition`).

A scan of L iterations over stacked layers (its scanned operands `[L, ...]`) whose carries
hold a batch becomes, for S stages of K = L / S consecutive layers and M microbatches, a
scan of M + S - 1 steps. At each step every stage applies its K layers (an inner scan of
the original body, batched over the stages with `jax.vmap`) to the microbatch it holds;
stage 0 (the last stage, for a reversed scan: the transposed scan autodiff makes) takes a
new microbatch, the last one finishes one, and the activations move one stage on (a roll
along the stage dimension). The program is the same function: the tactic that follows
tiles the stage dimension over the mesh axis, and propagation with the collective fusion
passes turns each roll into one `collective_permute` (`partir.hlo.fusion`).

Which dimension of each operand and result holds the batch, and how each stacked result
combines over microbatches, is found by the pipeline's own passes (`microbatch_layout`):
the carries' batch is tiled on a virtual axis of M devices in a module of the scan alone,
and propagation says where that tiling reaches. A stacked result tiled there is
kept per stage and microbatch (and put back together where an op other than a pipelined
scan reads it); one made by a sum over the batch (a weight gradient,
through ops linear in it: `Primitive.linear`) is accumulated over them; one that does not
depend on the batch is taken from the first. Anything else mixes a batch's examples
within a layer, which a pipeline cannot split, and is refused with the op's line.

A microbatch is strided: microbatch m holds rows m, m + M, m + 2M, ... of the batch, so
that a batch dimension tiled over another axis (BP) stays tiled in each microbatch.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from partir.core.actions import AnyAction, Loop, Sum, Tile
from partir.core.dialect import sliced_type
from partir.core.module import CoreModule
from partir.core.regions import BODIES, lower_region, structured
from partir.core.tmr import OpView, localized, lookup
from partir.errors import NotPipelineableError
from partir.frontend import TracedProgram
from partir.frontend.jaxpr_to_ir import inline_jaxpr
from partir.ir import Function, Location, Op, Region, TensorType, Value
from partir.ir.evaluate import evaluate
from partir.mesh import Mesh
from partir.rules.catalogue import CATALOGUE, region_ops
from partir.rules.collectives import ALL_REDUCE, NAMED_AXIS_OPS
from partir.rules.edges import EDGE_OPS
from partir.tactics.manual import ActionSpec, issue

# The virtual axis microbatches are found on (never a mesh axis of the program).
_MICROBATCH = "partir.microbatch"
# How a stacked result combines over microbatches, where it has no batch dimension.
SUMMED = "summed"  # a sum over the batch: accumulated
SAME = "same"  # independent of the batch: taken from the first microbatch


@dataclass(frozen=True)
class LocalOp:
    """An op of the layer's body as it runs on one microbatch: its parameters localized
    (`Primitive.localize`), and per operand the batch dimension to take the microbatch of
    where the operand is whole (a value made inside the body alike for every example)."""

    op: Op
    cut: tuple[int | None, ...]
    # Per operand, whether it is a term the same for every microbatch of a sum over the
    # batch (a weight's gradient from a term of the loss without the batch): each
    # microbatch adds its share, 1/M of it, so that the microbatches' sum counts it once.
    share: tuple[bool, ...]


@dataclass(frozen=True)
class Layout:
    """Where a scan over layers holds the batch: per const and scanned operand, the
    dimension (in the operand as given) or None (the same for every microbatch); per
    stacked result, its dimension, SUMMED or SAME. Every carry holds it in dimension 0."""

    consts: tuple[int | None, ...]
    xs: tuple[int | None, ...]
    ys: tuple[int | str, ...]
    body: tuple[LocalOp, ...]  # the body's ops on one microbatch
    yields: tuple[TensorType, ...]  # the types the body yields on one microbatch


def microbatch_layout(op: Op, microbatches: int, tactic: str) -> Layout:
    """Where the scan `op` holds its carries' batch (dimension 0 of each), and its body
    on one microbatch: found by tiling the batch on a virtual axis of `microbatches`
    devices and propagating through the scan."""
    nc, nk = op.params["num_consts"], op.params["num_carry"]
    if microbatches == 1:  # the whole batch at once: every value as it is
        (body,) = op.regions
        n = len(op.operands) - nc - nk
        return Layout((None,) * nc, (None,) * n, (SAME,) * (len(op.results) - nk),
                      tuple(LocalOp(o, (None,) * len(o.operands), (False,) * len(o.operands))
                            for o in body.ops), tuple(v.type for v in body.yields))
    if nk == 0:
        raise NotPipelineableError("the scan carries nothing from layer to layer, so there "
                                   "is no batch to split into microbatches",
                                   tactic=tactic, loc=op.loc)
    for k, v in enumerate(op.operands[nc:nc + nk]):
        if v.type.rank == 0 or v.type.shape[0] % microbatches:
            size = "a scalar" if v.type.rank == 0 else f"dimension 0 of size {v.type.shape[0]}"
            raise NotPipelineableError(
                f"carry {k} of the scan ({v.type}) has {size}, which {microbatches} "
                f"microbatches do not divide: a pipelined scan's carries hold the batch "
                f"in dimension 0", tactic=tactic, loc=op.loc)
    args = [Value(v.type, name=f"operand{i}") for i, v in enumerate(op.operands)]
    results = [Value(v.type) for v in op.results]
    scan = Op(op.name, args, results, op.params, op.regions, op.loc, op.prim)
    names = [a.name for a in args]
    fn = Function("layers", args, [scan], results, [f"result{k}" for k in range(len(results))])
    module = CoreModule(TracedProgram(fn, None, None, names, fn.result_names),
                        Mesh({_MICROBATCH: microbatches}))
    issue(module, [ActionSpec("tile", a.name, a, _MICROBATCH, 0) for a in args[nc:nc + nk]],
          tactic, op.loc)
    if module.conflicts:
        conflict = next(iter(module.conflicts.values()))
        raise NotPipelineableError(
            f"the layer's batch cannot be split into microbatches: {conflict.kind} at "
            f"{conflict.op}", tactic=tactic, loc=conflict.loc)
    consts, xs, ys, shares = _read_layout(module, scan, tactic)
    body, yields = _local_body(module, scan, microbatches, shares, tactic)
    return Layout(consts, xs, ys, body, yields)


def _read_layout(module: CoreModule, scan: Op, tactic: str) -> tuple[
        tuple[int | None, ...], tuple[int | None, ...], tuple[int | str, ...],
        dict[Value, tuple[bool, ...]]]:
    nc, nk = scan.params["num_consts"], scan.params["num_carry"]
    n_in = len(scan.operands)
    consts: list[int | None] = [None] * nc
    xs: list[int | None] = [None] * (n_in - nc - nk)
    ys: list[int | str] = [SAME] * (len(scan.results) - nk)
    # Each value of the body that depends on the batch: "tiled" (per example) or
    # "summed" (a sum over examples); absent: the same for every microbatch.
    state: dict[Value, str] = {}
    shares: dict[Value, tuple[bool, ...]] = {}  # by an op's first result: LocalOp.share
    # Until nothing changes: a loop inside the layer makes its carries' results at its
    # enter edges, which read what its body yields, flattened after them.
    while True:
        before = dict(state)
        for op in module.ops:
            loop = next((lp for lp in module.nest(op.uid) if lp.axis == _MICROBATCH), None)
            if op.name in EDGE_OPS and op.params["of"] is scan:
                kind, at = op.params["edge"]
                if kind == "carry" and (loop is None or loop.operands != (0, 0)):
                    raise NotPipelineableError(
                        f"carry {at} of the scan does not keep the batch in dimension 0 "
                        f"from layer to layer", tactic=tactic, loc=scan.loc)
                if kind == "exit":
                    ys[at - nk] = _stacked_result(loop, state.get(op.operands[0]), at, scan,
                                                  tactic)
                    continue
                if kind == "entry" and loop is not None:
                    (consts if at < nc else xs)[at if at < nc else at - nc - nk] = \
                        loop.operands[0]
            share = _classify(op, loop, state, tactic)
            if share is not None:
                shares[op.results[0]] = share
        if state == before:
            return tuple(consts), tuple(xs), tuple(ys), shares


def _local_body(module: CoreModule, scan: Op, microbatches: int,
                shares: dict[Value, tuple[bool, ...]], tactic: str
                ) -> tuple[tuple[LocalOp, ...], tuple[TensorType, ...]]:
    """The scan's body ops with the parameters of their local ops on one microbatch, as
    materialization localizes a tile's (`partir.core.materialize`)."""
    local: dict[Value, TensorType] = {}  # the values a microbatch holds a slice of

    def loop_of(v: Value) -> Loop | None:
        uid, _ = module.producer[v]
        return next((lp for lp in module.nest(uid) if lp.axis == _MICROBATCH), None)

    (body,) = scan.regions
    # The loops and branches inside the layer, as materialization restructures them:
    # each with its loop over the microbatches and its regions as programs of their own
    # (restructured only for a layer that has any).
    controls = {}
    if any(op.regions for op in body.ops):
        (layer,) = next(c for c in structured(module.snapshot()).ops
                        if BODIES in c.params).params[BODIES]
        controls = {r: (c, next((lp for lp in layer.nests.get(c.uid, ())
                                 if lp.axis == _MICROBATCH), None))
                    for c in layer.ops if BODIES in c.params for r in c.results}
    for a in body.args:
        loop = loop_of(a)
        k = module.by_uid[module.producer[a][0]].results.index(a)
        if loop is not None and isinstance(loop.results[k], Tile):
            local[a] = sliced_type(a.type, loop.results[k].dim, microbatches)
    out = []
    for op in body.ops:
        # (a loop's results are made by its edges: its own loop says what it works on)
        control, loop = controls[op.results[0]] if op.regions and op.results else \
            (None, loop_of(op.results[0]) if op.results else None)
        if loop is None:
            share = shares.get(op.results[0]) if op.results else None
            out.append(LocalOp(op, (None,) * len(op.operands),
                               share or (False,) * len(op.operands)))
            continue
        if control is not None:
            out.append(_local_control(op, control, loop, local, microbatches, tactic))
            continue
        entry = lookup(op.name)
        if entry.apply is not None:
            raise NotPipelineableError(
                f"{op.name} computes a microbatch's values from where they lie in the "
                f"batch, which the pipeline does not compute yet (one microbatch does)",
                tactic=tactic, loc=op.loc)
        cut = tuple(d if d is not None and v not in local else None
                    for v, d in zip(op.operands, loop.operands, strict=True))
        in_types = tuple(v.type if d is None else sliced_type(v.type, d, microbatches)
                         for v, d in zip(op.operands, loop.operands, strict=True))
        out_types = []
        for r, action in zip(op.results, loop.results, strict=True):
            t = r.type
            if isinstance(action, Tile):
                t = local[r] = sliced_type(t, action.dim, microbatches)
            out_types.append(t)
        params = localized(entry, OpView(op.name, op.params, in_types, tuple(out_types)))
        out.append(LocalOp(dataclasses.replace(op, params=params), cut,
                           (False,) * len(op.operands)))
    return tuple(out), tuple(local.get(v, v.type) for v in body.yields)


def _local_control(op: Op, control: Any, loop: Loop, local: dict[Value, TensorType],
                   microbatches: int, tactic: str) -> LocalOp:
    """A loop or branch inside the layer on one microbatch: its regions are the programs
    materialization makes of them (`partir.core.regions`), lowered on the microbatches'
    axis, where each works on its microbatch alone."""
    made = Op(op.name, op.operands, op.results, op.params,
              [lower_region(program) for program in control.params[BODIES]], op.loc, op.prim)
    made, summed = _accumulated(made)
    for inner, _ in region_ops(made):
        if inner.name in NAMED_AXIS_OPS:
            raise NotPipelineableError(
                f"the {op.name} inside the layer combines values across the batch at each "
                f"of its iterations (or computes from where they lie in it), which a layer "
                f"running on one microbatch at a time cannot (one microbatch can)",
                tactic=tactic, loc=inner.loc if inner.loc.line else op.loc)
    cut = tuple(d if d is not None and v not in local else None
                for v, d in zip(op.operands, loop.operands, strict=True))
    for r, action in zip(op.results, loop.results, strict=True):
        if isinstance(action, Tile):
            local[r] = sliced_type(r.type, action.dim, microbatches)
    nc = op.params.get("num_consts", 0)
    return LocalOp(made, cut, tuple(i - nc in summed for i in range(len(op.operands))))


def _linear(op: Op) -> bool:
    """Whether the op of partial sums is the sum of the op on each (`Primitive.linear`
    "all": a sum of its operands, a move of its elements)."""
    declared = CATALOGUE.get(op.name)
    return declared is not None and declared.linear == "all" and len(op.results) == 1


def _accumulated(op: Op) -> tuple[Op, frozenset[int]]:
    """A scan inside a pipelined layer that adds, at each iteration, a sum over the batch
    to a carry (a weight's gradient, accumulated over the steps of the layer's loop):
    its region, lowered on the microbatches' axis, reduces each step's sum over it. On
    one microbatch the carry accumulates the microbatch's part instead, its all_reduce
    dropped; the pipeline sums the microbatches' (the loop's result is a sum over the
    batch: `_classify`), each starting from its share of the carry's initial value
    (`LocalOp.share`). Returns the op so rewritten and the carries that now hold a
    microbatch's part."""
    if op.name != "scan":
        return op, frozenset()
    (region,) = op.regions
    nc, nk = op.params["num_consts"], op.params["num_carry"]
    users: dict[Value, list[Op]] = {}
    for inner in region.ops:
        for v in inner.operands:
            users.setdefault(v, []).append(inner)
    yielded = {v: [k for k, y in enumerate(region.yields) if y is v] for v in region.yields}

    def only_user(v: Value) -> Op | None:
        found = users.get(v, [])
        return found[0] if len(found) == 1 and not yielded.get(v) else None

    dropped: dict[Value, Value] = {}
    summed = set()
    for inner in region.ops:
        if inner.name != ALL_REDUCE or inner.params["axes"] != (_MICROBATCH,) or \
                inner.params["monoid"] != "add":
            continue
        v = inner.results[0]
        user = only_user(v)
        # through ops partial sums pass (`Primitive.linear`): a transpose, a reshape
        while user is not None and len(user.operands) == 1 and _linear(user):
            v, user = user.results[0], only_user(user.results[0])
        if user is None or len(user.operands) != 2 or not _linear(user):
            continue
        (other,) = [u for u in user.operands if u is not v] or [None]
        (total,) = user.results
        k = next((k for k in range(nk) if region.args[nc + k] is other), None)
        if k is None or users.get(other) != [user] or yielded.get(total) != [k] or \
                users.get(total):
            continue
        dropped[inner.results[0]] = inner.operands[0]
        summed.add(k)
    if not dropped:
        return op, frozenset()
    ops = [Op(o.name, [dropped.get(v, v) for v in o.operands], o.results, o.params,
              o.regions, o.loc, o.prim)
           for o in region.ops if not (o.results and o.results[0] in dropped)]
    body = Region(region.args, ops, region.yields)
    return Op(op.name, op.operands, op.results, op.params, [body], op.loc, op.prim), \
        frozenset(summed)


def _stacked_result(loop: Loop | None, state: str | None, at: int, scan: Op,
                    tactic: str) -> int | str:
    if loop is not None and isinstance(loop.results[0], Tile):
        return loop.results[0].dim
    if state is None:
        return SAME
    if state == "summed":
        return SUMMED
    raise NotPipelineableError(f"result {at} of the scan neither keeps the batch nor sums "
                               f"over it", tactic=tactic, loc=scan.loc)


def _classify(op: Any, loop: Loop | None, state: dict[Value, str], tactic: str
              ) -> tuple[bool, ...] | None:
    """Record how op's results depend on the batch, or refuse an op that mixes the
    examples of a microbatch with each other; for an op adding a term the same for every
    microbatch to a sum over the batch, which operands are such terms (`LocalOp.share`)."""
    deps = [state.get(v) for v in op.operands]
    if op.name in EDGE_OPS:  # a loop's or branch's edge passes values on, mixing nothing
        passed = "summed" if "summed" in deps else "tiled" if "tiled" in deps else None
        actions = loop.results if loop is not None else (None,) * len(op.results)
        for r, action in zip(op.results, actions, strict=True):
            if isinstance(action, Tile):
                state[r] = "tiled"
            elif isinstance(action, Sum) and action.monoid == "add":
                state[r] = "summed"
            elif passed is not None:
                state[r] = passed
        return None
    if loop is not None:
        for i, d in enumerate(deps):
            if d == "summed" or (d == "tiled" and loop.operands[i] is None):
                _mixes(op, tactic)
        for r, action in zip(op.results, loop.results, strict=True):
            if isinstance(action, Tile):
                state[r] = "tiled"
            elif isinstance(action, Sum) and action.monoid == "add":
                state[r] = "summed"
            elif isinstance(action, Sum | AnyAction) and any(deps):
                _mixes(op, tactic)
        return None
    if not any(deps):
        return None
    share = _linear_in(op, deps)
    if share is None:
        _mixes(op, tactic)
    for r in op.results:
        state[r] = "summed"
    return share if any(share) else None


def _linear_in(op: Any, deps: Sequence[str | None]) -> tuple[bool, ...] | None:
    """Whether op's result is the sum of its results on the summands, its operands being
    sums (`deps` "summed") or the same for every summand (None), as its declaration
    (`Primitive.linear`) says; if so, which operands are terms added to the sums, each
    summand to add its share of them. None where it is not."""
    if any(d == "tiled" for d in deps):
        return None
    declared = CATALOGUE.get(op.name)
    how = declared.linear if declared is not None else None
    summed = [d == "summed" for d in deps]
    # The operands that are terms of the sum: "all" (add, concatenate...), the cases of a
    # select, a division's numerator; the others must be the same for every summand.
    terms = (range(len(deps)) if how == "all" else range(1, len(deps)) if how == "cases"
             else how if isinstance(how, tuple) else ())
    if how == "one":
        return (False,) * len(deps) if sum(summed) == 1 else None
    if not terms or any(s for i, s in enumerate(summed) if i not in terms):
        return None
    share = tuple(i in terms and not s for i, s in enumerate(summed))
    if any(share) and not all(jnp.issubdtype(v.type.dtype, jnp.inexact)
                              for v, sh in zip(op.operands, share, strict=True) if sh):
        return None
    return share


def _mixes(op: Any, tactic: str) -> None:
    raise NotPipelineableError(
        f"{op.name} mixes the examples of a batch within a layer (a sum over the batch "
        f"that the layer goes on computing with, or a value gathered over it), so the "
        f"layers cannot run on microbatches one after another", tactic=tactic, loc=op.loc)


# --- the rewrite --------------------------------------------------------------------------

_SCOPE = "partir_layer_op_"
_SCOPED = re.compile(rf"{_SCOPE}(\d+)")


@dataclass(frozen=True)
class PerMicrobatch:
    """A stacked result of a pipelined scan as its schedule keeps it: per stage and
    microbatch, its layers' values, `[S, M + 1, K, ...]` (a layer's batch, one microbatch
    of it, in dimension `dim` of `...`; the last microbatch's place holds what the
    stages computed while idle)."""

    value: Value
    dim: int


@dataclass(frozen=True)
class Pipelined:
    """A pipelined scan: the ops computing it, its results (None for a stacked result
    that keeps the batch, which `reassemble` makes from its `PerMicrobatch` where it is read)."""

    ops: list[Op]
    results: list[Value | None]
    kept: dict[int, PerMicrobatch]  # by result position


def gpipe(op: Op, layout: Layout, stages: int, microbatches: int,
          kept: dict[int, PerMicrobatch]) -> Pipelined:
    """The ops computing the scan `op`'s results as a GPipe schedule of `stages` stages
    and `microbatches` microbatches (module docstring). A scanned operand given in
    `kept` (by its position among the op's operands) is read as the pipelined scan that
    made it kept it, each stage taking its microbatch's values there: the residuals a
    forward scan stacks for the backward one are never put back together. The body's ops
    keep their source lines; the schedule's own ops get the scan's."""
    (body,) = op.regions

    def locate(info: Any) -> Location | None:
        found = _SCOPED.search(str(info.name_stack))
        return body.ops[int(found.group(1))].loc if found else None

    operands = [kept[i].value if i in kept else v for i, v in enumerate(op.operands)]
    fn, keeps = _schedule(op, layout, stages, microbatches, set(kept))
    closed = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(v.type.shape, v.type.dtype)
                                  for v in operands))
    ops, outs = inline_jaxpr(closed, operands, op.loc, locate)
    # The carries, the accumulated stacked results, then the kept ones per microbatch.
    nk = op.params["num_carry"]
    made = {k: PerMicrobatch(v, layout.ys[k - nk] - 1)
            for k, v in zip(keeps, outs[len(outs) - len(keeps):], strict=True)}
    accumulated = iter(outs[nk:len(outs) - len(keeps)])
    results: list[Value | None] = [*outs[:nk], *(
        None if k in made else next(accumulated) for k in range(nk, len(op.results)))]
    return Pipelined(ops, results, made)


def reassemble(kept: PerMicrobatch, microbatches: int, loc: Location
               ) -> tuple[list[Op], Value]:
    """The ops making a stacked result `[L, ...]` with the whole batch from its values
    per microbatch, and that value."""
    def whole(y: Any) -> Any:
        S, K, e = y.shape[0], y.shape[2], kept.dim
        y = lax.slice_in_dim(y, 0, microbatches, axis=1)  # [S, M, K, ...]
        y = jnp.moveaxis(y, 1, 3 + e)  # [S, K, .., B/M, M, ..]
        y = y.reshape(*y.shape[:2 + e], -1, *y.shape[4 + e:])
        return y.reshape(S * K, *y.shape[2:])

    t = kept.value.type
    closed = jax.make_jaxpr(whole)(jax.ShapeDtypeStruct(t.shape, t.dtype))
    ops, (out,) = inline_jaxpr(closed, [kept.value], loc)
    return ops, out


def _schedule(op: Op, layout: Layout, S: int, M: int, kept_in: set[int]
              ) -> tuple[Any, list[int]]:
    """The schedule as a JAX function of the op's operands (those at the positions
    `kept_in` as `PerMicrobatch` values), returning its results and after them those of
    its stacked results that keep the batch, per microbatch; and their positions.

    Written with `lax` primitives and NumPy constants: `jax.numpy`'s functions are jitted
    wrappers, each a trace of its own the first time, which made the rewrite cost more
    than partitioning the program it makes."""
    p = op.params
    nc, nk, reverse = p["num_consts"], p["num_carry"], p["reverse"]
    K = p["length"] // S
    (body,) = op.regions
    kept = [nk + i for i, how in enumerate(layout.ys) if isinstance(how, int)]

    def layer_body(m: Any, args: Sequence[Any]) -> list[Any]:
        env = dict(zip(body.args, args, strict=True))
        for k, lo in enumerate(layout.body):
            with jax.named_scope(f"{_SCOPE}{k}"):
                operands = [env[v] if d is None else _take(micro(env[v], d), m, d + 1)
                            for v, d in zip(lo.op.operands, lo.cut, strict=True)]
                operands = [lax.div(x, lax.full(x.shape, M, x.dtype)) if sh else x
                            for x, sh in zip(operands, lo.share, strict=True)]
                env.update(zip(lo.op.results, evaluate(lo.op, operands), strict=True))
        return [env[v] for v in body.yields]

    def micro(v: Any, d: int) -> Any:  # [.., B, ..] -> [.., B/M, M, ..]
        return lax.reshape(v, (*v.shape[:d], v.shape[d] // M, M, *v.shape[d + 1:]))

    # Each stage's place in the pipeline: a reversed scan runs its layers last to first.
    place = np.arange(S, dtype=np.int32)
    place = S - 1 - place if reverse else place
    from_kept = [nc + nk + j in kept_in for j in range(len(layout.xs))]

    def run(*operands: Any) -> list[Any]:
        consts = [c if d is None else micro(c, d)
                  for c, d in zip(operands[:nc], layout.consts, strict=True)]
        init = [micro(c, 0) for c in operands[nc:nc + nk]]
        staged = []
        for x, d, made in zip(operands[nc + nk:], layout.xs, from_kept, strict=True):
            if not made:
                x = lax.reshape(x, (S, K, *x.shape[1:]))
                x = x if d is None else micro(x, d + 1)
            staged.append(x)

        def stage(xs: list[Any], carry: list[Any], m: Any) -> tuple[list[Any], list[Any]]:
            cs = [c if d is None else _take(c, m, d + 1)
                  for c, d in zip(consts, layout.consts, strict=True)]
            # A PerMicrobatch value is [M + 1, K, ...] on a stage: its microbatches' layers.
            xk = [_take(x, m, 0) if made else x if d is None else _take(x, m, d + 1)
                  for x, d, made in zip(xs, layout.xs, from_kept, strict=True)]

            def layer(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
                outs = layer_body(m, [*cs, *c, *x])
                return outs[:nk], outs[nk:]

            return lax.scan(layer, carry, xk, length=K, reverse=reverse)

        state = [lax.full((S, *c.shape[:1], *c.shape[2:]), 0, c.dtype) for c in init]
        accumulated = [i for i, how in enumerate(layout.ys) if how in (SUMMED, SAME)]
        ys_types = layout.yields[nk:]
        acc = [lax.full((S, K, *ys_types[i].shape), 0, ys_types[i].dtype)
               for i in accumulated]
        # Per stacked result that keeps the batch, each stage's layers' values per
        # microbatch: written as it works on one, the idle steps' in the extra last place.
        bufs = [lax.full((S, M + 1, K, *ys_types[k - nk].shape), 0, ys_types[k - nk].dtype)
                for k in kept]
        first, last = place == 0, place == S - 1

        def step(carried: tuple[list[Any], list[Any], list[Any]], t: Any
                 ) -> tuple[Any, Any]:
            state, acc, bufs = carried
            offset = lax.sub(lax.broadcast(t, (S,)), place)  # each stage's microbatch
            m = lax.clamp(np.int32(0), offset, np.int32(M - 1))
            now = lax.clamp(np.int32(0), t, np.int32(M - 1))
            ins = [_where(first, lax.broadcast(_take(c, now, 1), (S,)), s)
                   for c, s in zip(init, state, strict=True)]
            outs, ys = jax.vmap(stage)(staged, ins, m)
            valid = lax.bitwise_and(lax.ge(offset, np.int32(0)), lax.lt(offset, np.int32(M)))
            acc = [lax.add(a, _where(valid, ys[i], lax.full(a.shape, 0, a.dtype)))
                   if layout.ys[i] == SUMMED else
                   _where(lax.eq(offset, np.int32(0)), ys[i], a)
                   for i, a in zip(accumulated, acc, strict=True)]
            at = lax.reshape(lax.select(valid, m, lax.full((S,), M, np.int32)), (S, 1))
            bufs = [_put(b, ys[k - nk], at) for b, k in zip(bufs, kept, strict=True)]
            return ([_roll(o, reverse) for o in outs], acc, bufs), outs

        (_, acc, stacked), outs = lax.scan(step, (state, acc, bufs),
                                           np.arange(M + S - 1, dtype=np.int32))
        # Microbatch m leaves the last stage at step m + S - 1: every step's activations
        # are kept, and the last stage's are taken once, after the loop.
        carry = []
        for o in outs:  # [T, S, B/M, ...]
            only = lax.select(lax.broadcast_in_dim(last, o.shape, (1,)), o,
                              lax.full(o.shape, 0, o.dtype))
            done = lax.reduce(only, np.zeros((), o.dtype), lax.add, (1,))
            done = lax.slice_in_dim(done, S - 1, o.shape[0], axis=0)  # [M, B/M, ...]
            done = lax.transpose(done, (1, 0, *range(2, done.ndim)))  # [B/M, M, ...]
            carry.append(lax.reshape(done, (done.shape[0] * M, *done.shape[2:])))
        summed = [lax.reshape(a, (S * K, *a.shape[2:])) for a in acc]
        return [*carry, *summed, *stacked]

    return run, kept


def _take(v: Any, i: Any, axis: int) -> Any:
    """v's slice at index i (an int32 scalar, in range) of dimension `axis`: one gather
    (under the stages' vmap, with the stage as a batching dimension)."""
    dn = lax.GatherDimensionNumbers(offset_dims=tuple(range(v.ndim - 1)),
                                    collapsed_slice_dims=(axis,), start_index_map=(axis,))
    sizes = (*v.shape[:axis], 1, *v.shape[axis + 1:])
    return lax.gather(v, lax.reshape(i, (1,)), dn, sizes,
                      mode=lax.GatherScatterMode.CLIP)


def _put(buf: Any, y: Any, at: Any) -> Any:
    """buf `[S, M + 1, ...]` with each stage's y `[S, ...]` in its place `at` `[S, 1]` (in
    range) of dimension 1: one scatter, the stage its batching dimension."""
    dn = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(1, y.ndim)), inserted_window_dims=(1,),
        scatter_dims_to_operand_dims=(1,), operand_batching_dims=(0,),
        scatter_indices_batching_dims=(0,))
    return lax.scatter(buf, at, y, dn, unique_indices=True,
                       mode=lax.GatherScatterMode.CLIP)


def _where(mask: Any, a: Any, b: Any) -> Any:
    """a where the per-stage mask [S] holds, else b; a and b are [S, ...]."""
    return lax.select(lax.broadcast_in_dim(mask, a.shape, (0,)), a, b)


def _roll(v: Any, backward: bool) -> Any:
    """Every stage's value moved one stage on along dimension 0 (one back, `backward`)."""
    n = v.shape[0]
    if backward:
        return lax.concatenate([lax.slice_in_dim(v, 1, n), lax.slice_in_dim(v, 0, 1)], 0)
    return lax.concatenate([lax.slice_in_dim(v, n - 1, n), lax.slice_in_dim(v, 0, n - 1)], 0)
