"""What padding a Core program holds: the values whose tiling pads a dimension, and what
that wastes.

A dimension of size s tiled over axes of total size N has tiles of ceil(s / N) positions;
when N does not divide s it holds P = ceil(s / N) * N positions. Each axis pads the tiles
it splits (those of the dimension, or of the axes before it) to a multiple of its size:
12 on axes of 2 then 4 has tiles of 6 each padded to 8. Each record names the value (an
input by its name, an op's result by its name or the op's), the dimension, s, P, the
axes, the axis that pads (`padded_by`: the first that does not divide the tiles it
splits, whose tactic the padding is), and:
- `wasted_bytes`: the bytes of padding all the devices hold together: every device holds
  its local tile, the padded positions of a tile are waste (the value's other copies,
  on axes that do not tile it, hold theirs too);
- `wasted_flops`: for an op's result, the FLOPs its op spends on padding: the FLOPs of
  its local computation at the padded local shapes times the number of tiles its loop
  nest computes, minus the FLOPs of the unpartitioned op (0 for inputs; an op whose
  operands are padded but not its results, e.g. a masked reduction, is not counted).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from partir.core.actions import Tile
from partir.core.program import (
    CoreOp,
    CoreProgram,
    Nest,
    divided_type,
    sharding_of,
    tile_dims,
)
from partir.core.tmr import OpView, localized, lookup
from partir.ir import Value
from partir.ir.dtypes import itemsize
from partir.ir.fragments import Fragments
from partir.ir.types import padded_size, tile_size
from partir.mesh import Mesh
from partir.rules import CATALOGUE
from partir.rules.catalogue import flops_of
from partir.rules.edges import written_name


@dataclass
class OpPadding:
    """The records of a program's ops that pad (each op with its records), in program
    order: what the report of a program differing in a few ops starts from."""

    mesh: Mesh
    ops: list[tuple[CoreOp, list[dict[str, Any]]]]


def padding_report(program: CoreProgram, fragments: Fragments | None = None,
                   ops: OpPadding | None = None) -> list[dict[str, Any]]:
    """One record per padded dimension of an input or of an op's result. `fragments`:
    the records of each op (in its loops) of programs reported before, reused (a
    schedule's states share most ops and loops; `partir.ir.fragments`). `ops`: the
    program's `op_padding`, when made already."""
    out = []
    args = {a.name: a for a in reversed(program.args)}  # (the first of a name)
    for name, sharding in program.input_shardings().items():
        out += _records(program.mesh, args[name], name, sharding.dims, 0.0)
    for _, found in (ops if ops is not None else op_padding(program, fragments)).ops:
        out += found
    return out


def op_padding(program: CoreProgram, fragments: Fragments | None = None,
               since: OpPadding | None = None, changed: Sequence[CoreOp] = ()) -> OpPadding:
    """The records of the program's ops. With `since`, those of a program that differs
    from this one only in the ops `changed` (this program's, under their uids: ops a
    tactic inserted, rewired or gave another nest), only those are looked at: a
    one-leaf tactic changes a few dozen of a transformer's 2,500 ops."""
    mesh = program.mesh
    sizes = dict(mesh)
    mesh_items = tuple(sizes.items())
    nests = program.nests

    def records(op: CoreOp, nest: Nest) -> list[dict[str, Any]]:
        if fragments is None:
            return _op_records(mesh, sizes, op, nest)
        return fragments.get_or_make(("padding", mesh_items, id(op), id(nest)), (op, nest),
                                     lambda: _op_records(mesh, sizes, op, nest))

    def padded(ops: Iterable[CoreOp]) -> list[tuple[CoreOp, list[dict[str, Any]]]]:
        found = []
        for op in ops:
            nest = nests.get(op.uid)
            if not op.is_identity and nest:
                made = records(op, nest)
                if made:
                    found.append((op, made))
        return found

    if since is None or since.mesh != mesh:
        return OpPadding(mesh, padded(program.ops))
    uids = {op.uid for op in changed}
    kept = [entry for entry in since.ops if entry[0].uid not in uids]
    return OpPadding(mesh, sorted(kept + padded(changed), key=_order))


def _order(entry: tuple[CoreOp, list[dict[str, Any]]]) -> tuple[int, ...]:
    return entry[0].order


def _op_records(mesh: Mesh, sizes: dict[str, int], op: CoreOp, nest: Nest
                ) -> list[dict[str, Any]]:
    # Most ops tile nothing their axes do not divide: they are passed over at once.
    padded = [k for k, r in enumerate(op.results) if _pads(r.type.shape, nest, k, sizes)]
    if not padded:
        return []
    flops = _wasted_flops(op, nest, sizes)
    out = []
    for k in padded:
        r = op.results[k]
        out += _records(mesh, r, r.name or written_name(op), sharding_of(nest, k, r.type.rank).dims,
                        flops)
    return out


def _records(mesh: Mesh, v: Value, name: str, dims: tuple[tuple[str, ...], ...],
             flops: float) -> list[dict[str, Any]]:
    """The records of the dimensions of `v` that its sharding `dims` pads."""
    # input shardings name the user's axes where sub-axes make them up
    size = mesh.check_axis
    devices = math.prod(mesh.values())
    out = []
    for d, axes in enumerate(dims):
        s = v.type.shape[d]
        n = math.prod(size(a) for a in axes)
        if s % n == 0:  # then every axis divides the tiles it splits
            continue
        tiling = math.prod(size(a) for dim_axes in dims for a in dim_axes)
        local = math.prod(tile_size(m, math.prod(size(a) for a in dim_axes))
                          for m, dim_axes in zip(v.type.shape, dims, strict=True))
        wasted = (local * devices - v.type.size * devices // tiling) * itemsize(v.type.dtype)
        out.append({"value": name, "dim": d, "size": s, "padded": padded_size(s, n),
                    "axes": list(axes), "padded_by": _padding_axis(s, axes, size),
                    "wasted_bytes": int(wasted), "wasted_flops": float(flops)})
    return out


def _padding_axis(size: int, axes: tuple[str, ...], axis_size) -> str:
    """The first axis, major to minor, that does not divide the tiles it splits: the one
    whose tactic the padding is."""
    for a in axes:
        n = axis_size(a)
        if size % n:
            return a
        size //= n
    raise ValueError(f"no axis of {axes} pads a dimension of size {size}")


def _pads(shape: tuple[int, ...], nest: tuple, k: int, sizes: dict[str, int]) -> bool:
    """Whether the nest's loops tile a dimension of result k their axes do not divide."""
    parts = [1] * len(shape)
    for lp in nest:
        a = lp.results[k]
        if type(a) is Tile:
            parts[a.dim] *= sizes[lp.axis]
    return any(n % p for n, p in zip(shape, parts, strict=True))


def _wasted_flops(op: CoreOp, nest: tuple, sizes: dict[str, int]) -> float:
    primitive = CATALOGUE.get(op.name)
    entry = lookup(op.name)
    if primitive is None or entry is None:
        return 0.0
    levels = [sizes[lp.axis] for lp in nest]
    in_types = tuple(divided_type(v.type, [lp.operands[i] for lp in nest], levels)
                     for i, v in enumerate(op.operands))
    out_types = tuple(divided_type(r.type, tile_dims(nest, k), levels)
                      for k, r in enumerate(op.results))
    whole = op.view()
    try:
        params = localized(entry, OpView(op.name, op.params, in_types, out_types))
        local = OpView(op.name, params, in_types, out_types, regions=op.regions)
        flops = [flops_of(primitive, view) for view in (local, whole)]
    except Exception:  # a report, not a check: an op it cannot cost counts 0
        return 0.0
    return max(0.0, flops[0] * math.prod(levels) - flops[1])
