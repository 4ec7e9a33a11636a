"""PartIR:HLO collectives over mesh axes (paper, section 6, lst:mhlo-collectives).

Values are device-local tensors. A collective names mesh axes, and communicates within each
group of devices that differ only in their coordinates on those axes. Where a dimension is
split over several axes (a, b), a is major: the device with coordinates (i_a, i_b) holds
chunk i_a * |b| + i_b.

    %r = all_slice [{"x1"}, {}, {"x2"}] %x : tensor<8x5x10xf32>
    %r = all_gather [{"x1"}, {"x3"}, {}] %x : tensor<16x80x16xf32>
    %r = all_reduce <"x1", "x2"> %x : tensor<16x5x40xf32>
    %r = reduce_scatter [{"x1"}, {}, {"x2"}] %x : tensor<8x5x10xf32>
    %r = all_to_all {0 -> 1} <"x1", "x2"> %x : tensor<128x4xf32>
    %r = collective_permute <"x1"> {1 -> 0, 2 -> 1, 3 -> 2, 0 -> 3} %x : tensor<4x4xf32>
    %i = axis_index "x1" : tensor<i32>

A reduction other than addition prints as the paper's `<@red_fn>`: `all_reduce<@max> ...`.

The ops carry only the parameters the runtime reads (`axes`, `monoid`, `split_dim`,
`concat_dim`, `pairs`, `axis`), not the mesh: the registered type rules therefore check what does
not depend on axis sizes, and `verify_hlo` checks the shapes against the function's mesh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from jax import lax

from partir.ir import UNKNOWN_LOCATION, Function, Location, Op, TensorType, Value, verify
from partir.ir.monoids import NAMES as MONOIDS
from partir.ir.opnames import CONSTANT
from partir.ir.printer import Printer, register_op_printer
from partir.ir.types import padded_size, tensor_type
from partir.ir.verifier import VerificationError, register_type_rule
from partir.rules.catalogue import region_ops
from partir.rules.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_SLICE,
    ALL_TO_ALL,
    AXIS_INDEX,
    COLLECTIVE_PERMUTE,
    REDUCE_SCATTER,
    named_axes,
)

AXIS_INDEX_TYPE = TensorType((), np.dtype("int32"))
COLLECTIVES = (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL, COLLECTIVE_PERMUTE, ALL_SLICE)

AxesPerDim = tuple[tuple[str, ...], ...]


def axes_size(axes: Sequence[str], mesh: Mapping[str, int]) -> int:
    # A plain loop: the axes are few, and this runs per dimension of every collective.
    n = 1
    for a in axes:
        n *= mesh[a]
    return n


# The two below skip the dimensions with no axes (most of them) without a call.


def sliced_type(t: TensorType, axes: AxesPerDim, mesh: Mapping[str, int]) -> TensorType:
    """Each dimension divided by the size of its axes."""
    return tensor_type(tuple([n // axes_size(a, mesh) if a else n
                              for n, a in zip(t.shape, axes, strict=True)]), t.dtype)


def gathered_type(t: TensorType, axes: AxesPerDim, mesh: Mapping[str, int]) -> TensorType:
    """Each dimension multiplied by the size of its axes."""
    return tensor_type(tuple([n * axes_size(a, mesh) if a else n
                              for n, a in zip(t.shape, axes, strict=True)]), t.dtype)


def flat_axes(axes: AxesPerDim) -> tuple[str, ...]:
    return tuple(a for dim_axes in axes for a in dim_axes)


def _freeze(axes: Sequence[Sequence[str]]) -> AxesPerDim:
    return tuple([tuple(dim_axes) for dim_axes in axes])


# --- constructors ---------------------------------------------------------------------------


def make_all_slice(x: Value, axes: Sequence[Sequence[str]], mesh: Mapping[str, int],
                   name: str | None = None, loc: Location = UNKNOWN_LOCATION) -> Op:
    """Each device keeps its chunk of every dimension split over that dimension's axes
    (purely local: no communication)."""
    axes = _freeze(axes)
    return Op(ALL_SLICE, [x], [Value(sliced_type(x.type, axes, mesh), name)], {"axes": axes},
              loc=loc)


def make_padding(x: Value, axes: Sequence[Sequence[str]], mesh: Mapping[str, int],
                 loc: Location = UNKNOWN_LOCATION) -> list[Op]:
    """The ops padding x at the end of each dimension to a multiple of its axes' size, for
    an all_slice over them (none where they divide it): the tiles of a dimension they do
    not divide are those of the dimension padded (the padding holds zeros, which nothing
    reads)."""
    shape = x.type.shape
    padded = tuple(padded_size(n, axes_size(a, mesh)) if a else n
                   for n, a in zip(shape, axes, strict=True))
    if padded == shape:
        return []
    zero = Value(TensorType((), x.type.dtype))
    config = tuple((0, p - n, 0) for n, p in zip(shape, padded, strict=True))
    return [Op(CONSTANT, [], [zero], {"value": np.zeros((), x.type.dtype)}, loc=loc),
            Op("pad", [x, zero], [Value(x.type.with_shape(padded), x.name)],
               {"padding_config": config}, loc=loc, prim=lax.pad_p)]


def make_zeros(type_: TensorType, loc: Location = UNKNOWN_LOCATION) -> list[Op]:
    """The ops making zeros of `type_` (its last result): a scalar broadcast."""
    zero = Value(TensorType((), type_.dtype))
    return [Op(CONSTANT, [], [zero], {"value": np.zeros((), type_.dtype)}, loc=loc),
            Op("broadcast_in_dim", [zero], [Value(type_)],
               {"shape": type_.shape, "broadcast_dimensions": (), "sharding": None},
               loc=loc, prim=lax.broadcast_in_dim_p)]


def make_all_gather(x: Value, axes: Sequence[Sequence[str]], mesh: Mapping[str, int],
                    name: str | None = None, loc: Location = UNKNOWN_LOCATION) -> Op:
    """Concatenates the chunks of the devices of each dimension's axes, in the chunk
    order of all_slice: the inverse of all_slice on the same axes."""
    axes = _freeze(axes)
    return Op(ALL_GATHER, [x], [Value(gathered_type(x.type, axes, mesh), name)], {"axes": axes},
              loc=loc)


def make_all_reduce(x: Value, axes: Sequence[str], monoid: str = "add",
                    name: str | None = None, loc: Location = UNKNOWN_LOCATION) -> Op:
    """Reduces the operands of the devices of `axes` with the monoid; each of them gets
    the result."""
    return Op(ALL_REDUCE, [x], [Value(x.type, name)], {"axes": tuple(axes), "monoid": monoid},
              loc=loc)


def make_reduce_scatter(x: Value, axes: Sequence[Sequence[str]], mesh: Mapping[str, int],
                        monoid: str = "add", name: str | None = None,
                        loc: Location = UNKNOWN_LOCATION) -> Op:
    """all_slice(all_reduce(x) over every axis named) in one collective: reduces over all
    the axes and scatters each dimension over its own."""
    axes = _freeze(axes)
    return Op(REDUCE_SCATTER, [x], [Value(sliced_type(x.type, axes, mesh), name)],
              {"axes": axes, "monoid": monoid}, loc=loc)


def all_to_all_type(t: TensorType, split_dim: int, concat_dim: int, axes: Sequence[str],
                    mesh: Mapping[str, int]) -> TensorType:
    shape = list(t.shape)
    shape[split_dim] //= axes_size(axes, mesh)
    shape[concat_dim] *= axes_size(axes, mesh)
    return t.with_shape(tuple(shape))


def make_all_to_all(x: Value, split_dim: int, concat_dim: int, axes: Sequence[str],
                    mesh: Mapping[str, int], name: str | None = None,
                    loc: Location = UNKNOWN_LOCATION) -> Op:
    """all_slice on `split_dim` after all_gather on `concat_dim`, both over `axes`, in one
    exchange: each device splits `split_dim` into one piece per device of `axes`, sends
    piece j to device j, and concatenates the pieces it receives along `concat_dim` in the
    senders' order (XLA's AllToAll, and `lax.all_to_all(..., tiled=True)`). The sharding
    on `axes` moves from `concat_dim` to `split_dim`; the paper writes this
    `all_to_all {concat_dim -> split_dim}`, so {0 -> 1} <"x1","x2"> maps 16x32 to 128x4 on
    a mesh where |x1| |x2| = 8."""
    t = all_to_all_type(x.type, split_dim, concat_dim, axes, mesh)
    return Op(ALL_TO_ALL, [x], [Value(t, name)],
              {"split_dim": split_dim, "concat_dim": concat_dim, "axes": tuple(axes)}, loc=loc)


def make_collective_permute(x: Value, axes: Sequence[str], pairs: Sequence[tuple[int, int]],
                            name: str | None = None, loc: Location = UNKNOWN_LOCATION) -> Op:
    """Within each group of devices of `axes`, the device at chunk index `target` receives
    the operand of the device at `source`, for each (source, target) pair (XLA's
    CollectivePermute, `lax.ppermute`); a device no pair targets gets zeros. Chunk indices
    linearize the axes major to minor, as `all_slice` orders chunks."""
    return Op(COLLECTIVE_PERMUTE, [x], [Value(x.type, name)],
              {"axes": tuple(axes), "pairs": tuple((int(s), int(t)) for s, t in pairs)},
              loc=loc)


def make_axis_index(axis: str, name: str | None = None,
                    loc: Location = UNKNOWN_LOCATION) -> Op:
    """The device's coordinate on a mesh axis as an int32 scalar: what a Core `index` of a
    loop over the axis becomes once each device runs its own iteration."""
    return Op(AXIS_INDEX, [], [Value(AXIS_INDEX_TYPE, name)], {"axis": axis}, loc=loc)


def count_collectives(fn: Function, executed: bool = False) -> dict[str, int]:
    """How many of each collective the program holds (all_slice is local but counted, as
    the metadata contract asks), those inside loop bodies included; `executed`: how many
    run per call, a body's as many times as the loops around it run it (a while loop's
    body counted once: its trip count is not known)."""
    counts = dict.fromkeys((c.removeprefix("hlo.") for c in COLLECTIVES), 0)
    for (kind, _), n in collectives_by_axes(fn, executed).items():
        counts[kind] += n
    return counts


def collectives_by_axes(fn: Function, executed: bool = False
                        ) -> dict[tuple[str, tuple[str, ...]], int]:
    """`count_collectives` by (kind, the mesh axes it communicates over)."""
    counts: dict[tuple[str, tuple[str, ...]], int] = {}

    def count(op: Op, times: int) -> None:
        key = (op.name.removeprefix("hlo."), named_axes(op))
        counts[key] = counts.get(key, 0) + times

    for op in fn.ops:
        if op.name in COLLECTIVES:
            count(op, 1)
        # The test keeps a generator off every op without regions (all but a few).
        for inner, times in region_ops(op) if op.regions else ():
            if inner.name in COLLECTIVES:
                count(inner, (times or 1) if executed else 1)
    return counts


# --- printers -------------------------------------------------------------------------------


def format_axes(axes: Sequence[str]) -> str:
    return "{" + ", ".join(f'"{a}"' for a in axes) + "}"


def format_axes_per_dim(axes: AxesPerDim) -> str:
    return "[" + ", ".join(format_axes(a) for a in axes) + "]"


def _reduction(monoid: str) -> str:
    return "" if monoid == "add" else f"<@{monoid}>"


def _emit(p: Printer, op: Op, depth: int, head: str) -> None:
    p.emit(depth, f"{p.results_prefix(op)}{head} {p.ref(op.operands[0])} : {p.result_types(op)}")


@register_op_printer(ALL_SLICE)
def _print_all_slice(p: Printer, op: Op, depth: int) -> None:
    _emit(p, op, depth, f"all_slice {format_axes_per_dim(op.params['axes'])}")


@register_op_printer(ALL_GATHER)
def _print_all_gather(p: Printer, op: Op, depth: int) -> None:
    _emit(p, op, depth, f"all_gather {format_axes_per_dim(op.params['axes'])}")


@register_op_printer(ALL_REDUCE)
def _print_all_reduce(p: Printer, op: Op, depth: int) -> None:
    axes = ", ".join(f'"{a}"' for a in op.params["axes"])
    _emit(p, op, depth, f"all_reduce{_reduction(op.params['monoid'])} <{axes}>")


@register_op_printer(REDUCE_SCATTER)
def _print_reduce_scatter(p: Printer, op: Op, depth: int) -> None:
    _emit(p, op, depth, f"reduce_scatter{_reduction(op.params['monoid'])} "
                        f"{format_axes_per_dim(op.params['axes'])}")


@register_op_printer(ALL_TO_ALL)
def _print_all_to_all(p: Printer, op: Op, depth: int) -> None:
    axes = ", ".join(f'"{a}"' for a in op.params["axes"])
    _emit(p, op, depth, f"all_to_all {{{op.params['concat_dim']} -> {op.params['split_dim']}}}"
                        f" <{axes}>")


@register_op_printer(COLLECTIVE_PERMUTE)
def _print_collective_permute(p: Printer, op: Op, depth: int) -> None:
    axes = ", ".join(f'"{a}"' for a in op.params["axes"])
    pairs = ", ".join(f"{s} -> {t}" for s, t in op.params["pairs"])
    _emit(p, op, depth, f"collective_permute <{axes}> {{{pairs}}}")


@register_op_printer(AXIS_INDEX)
def _print_axis_index(p: Printer, op: Op, depth: int) -> None:
    p.emit(depth, f'{p.results_prefix(op)}axis_index "{op.params["axis"]}" : '
                  f"{p.result_types(op)}")


# --- typing rules ---------------------------------------------------------------------------
# The registered rules check what holds whatever the axis sizes; `collective_type_error`
# adds the sizes of a mesh.


def _distinct_axes(axes: Sequence[str]) -> str | None:
    if len(set(axes)) != len(axes):
        return f"names an axis twice: {tuple(axes)}"
    return None


def _per_dim_error(op: Op, divides: bool) -> str | None:
    """Rank and dtype kept, axes named once, and each dimension with axes shrinks
    (`divides`) or grows by a whole factor; dimensions without axes keep their size."""
    (x,), (r,) = op.operands, op.results
    axes = op.params["axes"]
    if not isinstance(x.type, TensorType) or not isinstance(r.type, TensorType):
        return "operand and result must be tensors"
    if len(axes) != x.type.rank or r.type.rank != x.type.rank:
        return f"needs one axes entry per dimension of {x.type} and a result of its rank"
    if r.type.dtype != x.type.dtype:
        return f"result element type of {r.type} differs from the operand's {x.type}"
    msg = _distinct_axes(flat_axes(axes))
    if msg:
        return msg
    for d, (dim_axes, n, m) in enumerate(zip(axes, x.type.shape, r.type.shape, strict=True)):
        small, big = (m, n) if divides else (n, m)
        if (not dim_axes and n != m) or (dim_axes and (small == 0 or big % small)):
            return f"dimension {d} cannot go from {n} to {m} over axes {dim_axes}"
    return None


def _monoid_error(op: Op) -> str | None:
    if op.params["monoid"] not in MONOIDS:
        return f"unknown monoid {op.params['monoid']!r}; expected one of {MONOIDS}"
    return None


@register_type_rule(ALL_SLICE)
def _all_slice_type(op: Op) -> str | None:
    return _per_dim_error(op, divides=True)


@register_type_rule(ALL_GATHER)
def _all_gather_type(op: Op) -> str | None:
    return _per_dim_error(op, divides=False)


@register_type_rule(REDUCE_SCATTER)
def _reduce_scatter_type(op: Op) -> str | None:
    return _monoid_error(op) or _per_dim_error(op, divides=True)


@register_type_rule(ALL_REDUCE)
def _all_reduce_type(op: Op) -> str | None:
    (x,), (r,) = op.operands, op.results
    if r.type != x.type:
        return f"result {r.type} must have the operand's type {x.type}"
    return _monoid_error(op) or _distinct_axes(op.params["axes"])


@register_type_rule(ALL_TO_ALL)
def _all_to_all_type(op: Op) -> str | None:
    (x,), (r,) = op.operands, op.results
    s, c = op.params["split_dim"], op.params["concat_dim"]
    if not (0 <= s < x.type.rank and 0 <= c < x.type.rank) or s == c:
        return f"split_dim {s} and concat_dim {c} must be distinct dimensions of {x.type}"
    if r.type.dtype != x.type.dtype or r.type.rank != x.type.rank:
        return f"result {r.type} must have the operand's rank and element type"
    xs, rs = x.type.shape, r.type.shape
    if any(xs[d] != rs[d] for d in range(x.type.rank) if d not in (s, c)):
        return f"only dimensions {s} and {c} may change, got {x.type} -> {r.type}"
    if rs[s] == 0 or xs[s] % rs[s] or rs[c] != xs[c] * (xs[s] // rs[s]):
        return f"dimension {s} must shrink by the factor dimension {c} grows by"
    return _distinct_axes(op.params["axes"])


@register_type_rule(COLLECTIVE_PERMUTE)
def _collective_permute_type(op: Op) -> str | None:
    (x,), (r,) = op.operands, op.results
    if r.type != x.type:
        return f"result {r.type} must have the operand's type {x.type}"
    sources = [s for s, _ in op.params["pairs"]]
    targets = [t for _, t in op.params["pairs"]]
    if min(sources + targets, default=0) < 0:
        return f"pairs {op.params['pairs']} name a negative chunk index"
    if len(set(sources)) != len(sources) or len(set(targets)) != len(targets):
        return f"pairs {op.params['pairs']} send from or to one device twice"
    return _distinct_axes(op.params["axes"])


@register_type_rule(AXIS_INDEX)
def _axis_index_type(op: Op) -> str | None:
    (r,) = op.results
    if op.operands or r.type != AXIS_INDEX_TYPE:
        return f'axis_index "{op.params["axis"]}" takes no operand and gives {AXIS_INDEX_TYPE}'
    return None


def collective_type_error(op: Op, mesh: Mapping[str, int]) -> str | None:
    """Why an HLO op's result type is wrong on the mesh, or None (also for other ops)."""
    if op.name == AXIS_INDEX:
        named: Sequence[str] = (op.params["axis"],)
    elif op.name in (ALL_SLICE, ALL_GATHER, REDUCE_SCATTER):
        named = flat_axes(op.params["axes"])
    elif op.name in (ALL_REDUCE, ALL_TO_ALL, COLLECTIVE_PERMUTE):
        named = op.params["axes"]
    else:
        return None
    missing = [a for a in named if a not in mesh]
    if missing:
        return f"names axes {missing} that are not in the mesh {dict(mesh)}"
    if op.name == COLLECTIVE_PERMUTE:
        n = axes_size(named, mesh)
        outside = [p for p in op.params["pairs"] if max(p) >= n]
        return f"pairs {outside} name devices beyond the {n} of axes {tuple(named)}" \
            if outside else None
    if op.name in (AXIS_INDEX, ALL_REDUCE):
        return None  # its type does not depend on the sizes: the registered rule suffices
    elif op.name == ALL_GATHER:
        want: object = gathered_type(op.operands[0].type, op.params["axes"], mesh)
    else:
        x = op.operands[0].type
        split = ((op.params["split_dim"], op.params["axes"]),) if op.name == ALL_TO_ALL \
            else tuple(enumerate(op.params["axes"]))
        for d, axes in split:
            if x.shape[d] % axes_size(axes, mesh):
                return f"dimension {d} of {x} does not divide over axes {tuple(axes)}"
        want = all_to_all_type(x, op.params["split_dim"], op.params["concat_dim"],
                               op.params["axes"], mesh) if op.name == ALL_TO_ALL \
            else sliced_type(x, op.params["axes"], mesh)
    if op.results[0].type != want:
        return f"result {op.results[0].type} should be {want}"
    return None


def _sharding_error(what: str, t: object, sharding: object, mesh: Mapping[str, int]
                    ) -> str | None:
    if not isinstance(t, TensorType):
        return f"{what} must be a tensor, got {t}"
    if not isinstance(sharding, tuple) or len(sharding) != t.rank:
        return f"{what} of type {t} needs one tuple of axes per dimension, got {sharding!r}"
    axes = flat_axes(sharding)
    if not set(axes) <= set(mesh) or len(set(axes)) != len(axes):
        return f"{what} has sharding {sharding!r}: axes must be distinct axes of the mesh"
    return None


def verify_hlo(fn: Function, check_primitives: bool = False) -> None:
    """`partir.ir.verify` plus the checks that need the mesh: collective shapes, axis
    indices, and one well-formed sharding per argument and result."""
    verify(fn, check_primitives=check_primitives)
    mesh = fn.attributes.get("mesh")
    if not isinstance(mesh, Mapping):
        raise VerificationError(f"@{fn.name} needs its mesh in attributes['mesh']")
    for key, values in (("in_shardings", fn.args), ("out_shardings", fn.results)):
        shardings = fn.attributes.get(key)
        if not isinstance(shardings, tuple) or len(shardings) != len(values):
            raise VerificationError(f"attributes['{key}'] must hold one sharding per value, "
                                    f"got {shardings!r}")
        for i, (v, sharding) in enumerate(zip(values, shardings, strict=True)):
            msg = _sharding_error(f"{key}[{i}]", v.type, sharding, mesh)
            if msg:
                raise VerificationError(msg)
    for op in fn.ops:
        for checked in (op, *(inner for inner, _ in region_ops(op))):
            msg = collective_type_error(checked, mesh)
            if msg:
                raise VerificationError(f"{checked.name} at {checked.loc}: {msg}")
