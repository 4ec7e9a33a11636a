"""PartIR:SPMD -> PartIR:HLO (paper, section 6 and App. C, "Lowering redistribution and
tile_reduce instructions").

A value of type mu becomes the device-local tensor L(mu) each device holds; devices the
type does not distinguish hold equal tensors. Then:
- an `execute` is flattened: every device runs the body once, with the body's ranges
  bound to the device's coordinates. `slice d x[r]` becomes `all_slice` of x on d over
  r's axis, and `index r` the device's coordinate on it, `axis_index`;
- `tile_reduce [#sum<a>]` is an `all_reduce <a>`; `#tile` and `any` change the type only:
  the devices already hold the tiles (resp. equal values) the new type describes;
- `redistribute` from mu1 to mu2 is one all_gather/all_slice pair through the common
  type: per dimension, the leading axes both types share stay, the other axes of mu1 are
  gathered and those of mu2 sliced. Axes are major to minor and `#tile` prepends its axis,
  so the axes that differ are the trailing ones, the only ones a gather can undo;
- ops outside executes run on every device on the whole (replicated) tensors.
Arguments start replicated and results end replicated (`in_shardings`/`out_shardings`
all `()`); the fusion passes then make them device-local where they can.

Collectives carry the model source line they are attributed to (the SPMD ops that cause
them have none): an all_reduce that of the op whose partial results it sums, a gather or
slice that of the op computing its operand; `locate_by_users` gives the others (of
arguments) that of their first user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from jax import lax

import partir.cancel as cancel
from partir.core.actions import Sum
from partir.core.dialect import INDEX, SLICE
from partir.hlo.ops import (
    AxesPerDim,
    axes_size,
    make_all_gather,
    make_all_reduce,
    make_all_slice,
    make_axis_index,
    make_padding,
)
from partir.ir import UNKNOWN_LOCATION, Function, Location, Op, TensorType, Type, Value
from partir.mesh import Mesh
from partir.spmd.ops import EXECUTE, REDISTRIBUTE, TILE_REDUCE
from partir.spmd.types import DTensorType


class HloLoweringError(Exception):
    """The SPMD program has no PartIR:HLO counterpart (e.g. it returns a stacked value)."""


def _dtensor(t: Type) -> DTensorType:
    # A tensor outside an execute is dtensor<{}, [n,...]> (EqTM).
    return t if isinstance(t, DTensorType) else DTensorType.of(t)


def redistribution(src: DTensorType, dst: DTensorType) -> tuple[AxesPerDim, AxesPerDim]:
    """The axes to gather, then to slice, per dimension, to turn src into dst: all but the
    longest common prefix of each dimension's axes."""
    gather, slice_ = [], []
    for (a1, _), (a2, _) in zip(src.dims, dst.dims, strict=True):
        if a1 == a2:  # the usual case, all the dimension's axes shared (often none)
            gather.append(())
            slice_.append(())
            continue
        k, n = 0, min(len(a1), len(a2))
        while k < n and a1[k] == a2[k]:
            k += 1
        gather.append(a1[k:])
        slice_.append(a2[k:])
    return tuple(gather), tuple(slice_)


def lower_spmd_to_hlo(fn: Function, *, defer_gathers: bool = False) -> Function:
    """The device-local PartIR:HLO program of an SPMD function, as the paper lowers it.

    With `defer_gathers`, each all_gather is emitted at its first use, and not at all when
    every use slices it back on the same axes (all_slice . all_gather = id): a loop's
    tiled result that the next loop slices alike, the common case, which `optimize` would
    cancel anyway. The program is the same after `optimize`, and built faster."""
    mesh = fn.attributes.get("mesh")
    if not isinstance(mesh, Mapping):
        raise HloLoweringError(f"@{fn.name} needs its mesh in attributes['mesh'], got {mesh!r}")
    return _Lowering(fn, mesh if isinstance(mesh, Mesh) else Mesh(mesh), defer_gathers).run()


class _Lowering:
    def __init__(self, fn: Function, mesh: Mesh, defer_gathers: bool) -> None:
        self.fn = fn
        self.mesh = mesh
        self.defer_gathers = defer_gathers
        self.out: list[Op] = []
        self.env: dict[Value, Value] = {}  # SPMD value -> its device-local HLO value
        self.origin: dict[Value, Location] = {}  # HLO value -> where its op was written
        self.sizes = dict(mesh.items())  # for the collectives' types: cheaper than the Mesh
        # L(mu) per SPMD type: values share few types, and `clone` asks per result.
        self.local_types: dict[Type, Type] = {}
        # With defer_gathers, the gathers not emitted yet, by result.
        self.pending: dict[Value, Op] = {}
        # (id(src), id(dst)) -> (src, dst, *`_plan(src, dst)`): the SPMD types are shared
        # objects (`DTensorType.of`, the tile_reduce types), and the redistributions of a
        # model's layers repeat few pairs of them. Keyed by identity, which costs no
        # Python-level hash; the entry holds both types, so their ids stay theirs.
        self.plans: dict[tuple[int, int], tuple] = {}

    def run(self) -> Function:
        args = []
        constraints = (self.fn.attributes.get("in_constraints")
                       or (None,) * len(self.fn.args))
        in_shardings = []
        for a, asked in zip(self.fn.args, constraints, strict=True):
            t = _dtensor(a.type)
            if t.axes:
                raise HloLoweringError(f"argument %{a.name} of type {t} is not a global tensor")
            if asked is None:
                args.append(Value(t.local_type(self.mesh), a.name))
                self.env[a] = args[-1]
                in_shardings.append(((),) * t.rank)
                continue
            # It arrives sliced as asked: gathered where a use needs it whole (a use
            # slicing it alike reads it as it is: `defer_gathers`).
            laid = DTensorType((), tuple((axes, n) for axes, (_, n)
                                         in zip(asked, t.dims, strict=True)), t.dtype)
            args.append(Value(laid.local_type(self.mesh), a.name))
            self.env[a] = self.redistribute(args[-1], laid, t, a.name, UNKNOWN_LOCATION)
            in_shardings.append(tuple(asked))
        token = cancel.current()
        for op in self.fn.ops:
            if token is not None and token.cancelled:
                token.check()
            if op.name == EXECUTE:
                self.execute(op)
            elif op.name == TILE_REDUCE:
                self.tile_reduce(op)
            elif op.name == REDISTRIBUTE:
                (x,), (r,) = op.operands, op.results
                self.env[r] = self.redistribute(self.env[x], _dtensor(x.type), _dtensor(r.type),
                                                r.name, op.loc)
            else:
                self.top_level(op)
        results = []
        for v in self.fn.results:
            t = _dtensor(v.type)
            if t.stacked:
                raise HloLoweringError(f"result %{v.name} of type {t} has stacked axes: it has "
                                       "no global value to return")
            replicated = DTensorType((), tuple(((), n) for n in t.sizes), t.dtype)
            results.append(self.redistribute(self.env[v], t, replicated, v.name,
                                             UNKNOWN_LOCATION))
        for r in results:
            self.need(r)
        attributes = {**self.fn.attributes, "mesh": self.mesh,
                      "in_shardings": tuple(in_shardings),
                      "out_shardings": tuple(((),) * r.type.rank for r in results)}
        return Function(self.fn.name, args, self.out, results, list(self.fn.result_names),
                        attributes)

    def clone(self, op: Op, sub: dict[Value, Value]) -> Op:
        """op on the device-local values, with device-local result types; `sub` maps op's
        results to the clone's."""
        local_types = self.local_types
        operands = [sub[v] for v in op.operands]
        pending = self.pending
        # One test in C for all operands: most ops read no deferred gather.
        if pending and not pending.keys().isdisjoint(operands):
            for v in operands:
                self.need(v)
        results = []
        for r in op.results:
            t = r.type
            # A tensor (what an execute's body computes) is its own device-local type:
            # the immutable type is shared, sparing the hash of a lookup.
            if t.__class__ is not TensorType:
                t = local_types.get(r.type)
                if t is None:
                    t = local_types[r.type] = _dtensor(r.type).local_type(self.mesh)
            new_r = sub[r] = Value(t, r.name)
            results.append(new_r)
        # The parameters are shared: IR is never mutated.
        new = Op(op.name, operands, results, op.params, op.regions, op.loc, op.prim)
        self.out.append(new)
        if op.loc.line:
            origin = self.origin
            for r in results:
                origin[r] = op.loc
        return new

    def top_level(self, op: Op) -> None:
        """An op outside executes runs on whole tensors, which every device holds."""
        for v in op.operands:
            if _dtensor(v.type).axes:
                raise HloLoweringError(f"{op.name} at {op.loc} runs outside an execute on "
                                       f"%{v.name or v.id} of type {v.type}, which is not the "
                                       "same on every device")
        self.clone(op, self.env)

    def execute(self, op: Op) -> None:
        axes = op.params["axes"]
        region = op.regions[0]
        ranges, locals_ = region.args[:len(axes)], region.args[len(axes):]
        sub: dict[Value, Value] = {}
        for x, y in zip(op.operands, locals_, strict=True):
            local = self.env[x]
            if local.type is not y.type and local.type != y.type:
                raise HloLoweringError(f"execute local %{y.name} has type {y.type} but its "
                                       f"operand's local tensor is {local.type}")
            sub[y] = local
        range_set = set(ranges)
        for body_op in region.ops:
            if body_op.name == SLICE:
                x, r = body_op.operands
                axes_per_dim = [()] * x.type.rank
                axes_per_dim[body_op.params["dim"]] = (r.type.axis,)
                gather = self.pending.get(sub[x])
                if gather is not None and gather.params["axes"] == tuple(axes_per_dim):
                    sub[body_op.results[0]] = gather.operands[0]
                    continue
                self.need(sub[x])
                source = self.pad_to(sub[x], axes_per_dim, body_op.loc)
                sliced = make_all_slice(source, axes_per_dim, self.sizes,
                                        body_op.results[0].name, body_op.loc)
                self.out.append(sliced)
                sub[body_op.results[0]] = sliced.results[0]
                continue
            if body_op.name == INDEX:
                (r,), (i,) = body_op.operands, body_op.results
                made = make_axis_index(r.type.axis, i.name, body_op.loc)
                self.out.append(made)
                sub[i] = made.results[0]
                continue
            if not range_set.isdisjoint(body_op.operands):  # one test for all operands
                raise HloLoweringError(f"{body_op.name} at {body_op.loc} reads a range, which "
                                       "only `slice` and `index` may")
            self.clone(body_op, sub)
        for r, y in zip(op.results, region.yields, strict=True):
            self.env[r] = sub[y]

    def tile_reduce(self, op: Op) -> None:
        (x,), (r,) = op.operands, op.results
        action = op.params["action"]
        if isinstance(action, Sum):
            local = self.env[x]
            self.need(local)
            reduced = make_all_reduce(local, (op.params["axis"],), action.monoid, r.name,
                                      self.origin.get(local, op.loc))
            self.out.append(reduced)
            self.env[r] = reduced.results[0]
        else:
            # #tile: the local tensors stacked on the axis are already the tiles of the
            # dimension; any: they are already equal. Only the SPMD type changes.
            self.env[r] = self.env[x]

    def redistribute(self, x: Value, src: DTensorType, dst: DTensorType, name: str | None,
                     loc: Location) -> Value:
        key = (id(src), id(dst))
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = (src, dst, *self._plan(src, dst))
        _, _, gather, want, slice_ = plan
        if not loc.line:
            loc = self.origin.get(x, loc)
        if gather is not None:
            op = make_all_gather(x, gather, self.sizes, name, loc)
            x = op.results[0]
            if want is not None and want.shape != x.type.shape:
                self.need(op.operands[0])
                self.out.append(op)
                self.pending.pop(x, None)
                x = self.unpad(x, want, name, loc)
            elif self.defer_gathers:
                self.pending[x] = op
            else:
                self.out.append(op)
        if slice_ is not None:
            self.need(x)
            x = self.pad_to(x, slice_, loc)
            op = make_all_slice(x, slice_, self.sizes, name, loc)
            self.out.append(op)
            x = op.results[0]
        return x

    def _plan(self, src: DTensorType, dst: DTensorType
              ) -> tuple[AxesPerDim | None, TensorType | None, AxesPerDim | None]:
        """What turning src into dst takes, for any value: the axes to gather (None:
        none), the local type the gathered tensor is cut back to (None: no gathered axis
        padded a dimension), and the axes to slice then (None: none)."""
        gather, slice_ = redistribution(src, dst)
        want = None
        # Where the gathered axes padded a dimension, the common type's local tensor is
        # smaller than the gathered one: its padding is sliced off.
        if any(g and n % axes_size(axes, self.sizes)
               for (axes, n), g in zip(src.dims, gather, strict=True)):
            common = DTensorType((), tuple((axes[:len(axes) - len(g)], n)
                                           for (axes, n), g
                                           in zip(src.dims, gather, strict=True)),
                                 src.dtype)
            want = common.local_type(self.mesh)
        return (gather if any(gather) else None, want, slice_ if any(slice_) else None)

    def pad_to(self, x: Value, axes: AxesPerDim, loc: Location) -> Value:
        """x padded at the end of each dimension to a multiple of its axes' size, for an
        all_slice over them (`make_padding`)."""
        ops = make_padding(x, axes, self.sizes, loc)
        self.out += ops
        return ops[-1].results[0] if ops else x

    def unpad(self, x: Value, want: TensorType, name: str | None, loc: Location) -> Value:
        """The leading `want.shape` of x: a gathered padded dimension cut to its size."""
        r = Value(want, name)
        self.out.append(Op("slice", [x], [r], {"start_indices": (0,) * want.rank,
                                               "limit_indices": want.shape, "strides": None},
                           loc=loc, prim=lax.slice_p))
        return r

    def need(self, v: Value) -> None:
        """Emit the pending gather computing v, if any (and those it reads first)."""
        op = self.pending.pop(v, None)
        if op is not None:
            self.need(op.operands[0])
            self.out.append(op)



def locate_by_users(fn: Function) -> Function:
    """Collectives without a location take that of their first user that has one (a
    gathered argument is attributed to the op that needs it whole). Run after the fusion
    passes, which leave fewer collectives to place."""
    unplaced = {op.results[0] for op in fn.ops
                if not op.loc.line and op.name.startswith("hlo.") and op.results}
    if not unplaced:
        return fn
    first_user: dict[Value, Location] = {}
    out: list[Op] = []
    for op in reversed(fn.ops):  # users first: a chain of collectives takes its end's line
        if op.results and op.results[0] in unplaced:
            loc = first_user.get(op.results[0])
            if loc is not None:
                # dataclasses.replace(op, loc=loc), spelled out: it is much slower
                op = Op(op.name, op.operands, op.results, op.params, op.regions, loc, op.prim)
        if op.loc.line:
            for v in op.operands:
                if v in unplaced:
                    first_user[v] = op.loc
        out.append(op)
    return replace(fn, ops=out[::-1])
