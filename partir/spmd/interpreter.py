"""Interpreter of PartIR:SPMD after its denotational semantics (paper, App. C, fig.
"Interpretation of PartIR:SPMD"): the second correctness oracle of the lowering.

A distributed value is the collection of device-local tensors its type describes: one
local array per coordinate on the mesh axes the type mentions, stacked or distributed
(axes it does not mention replicate it). This is the paper's function from stacked
coordinates (and the coordinate of a distributed axis, its lambda^d) to local tensors,
generalised to any number of distributed axes.

- `execute` runs its Core body once per coordinate of its axes, binding the ranges to the
  coordinates and each local to the operand's tensor on that device; a body op whose own
  bodies hold collectives over the execute's axes runs at every coordinate at once, in
  lockstep (`in_lockstep`);
- `tile_reduce` with #tile only changes the type: the local tensors stacked on the axis
  are now viewed as tiles of a dimension; #sum and any combine them over the axis;
- `redistribute` assembles the global tensor of each stacked slice from its tiles and
  splits it again by the new type;
- ops outside an execute run on whole tensors (their values mention no axis).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from partir.core.actions import Tile
from partir.core.interpreter import (
    InterpreterError,
    combine,
    eval_alike,
    in_lockstep,
    lockstep_axes,
    pad_dim,
)
from partir.ir import Function, Op, TensorType, Value
from partir.ir.dtypes import assembled, sliceable
from partir.ir.types import padded_size, tile_size
from partir.mesh import Mesh
from partir.spmd.ops import EXECUTE, REDISTRIBUTE, TILE_REDUCE
from partir.spmd.types import DTensorType

# A distributed value: coordinates on the axes its type mentions (in mesh order) -> array.
Tiles = dict[tuple[int, ...], Any]


class SpmdInterpreterError(InterpreterError):
    pass


def _dtensor(t: DTensorType | TensorType) -> DTensorType:
    # A tensor type outside an execute is the same data as dtensor<{}, [n,...]> (EqTM).
    return t if isinstance(t, DTensorType) else DTensorType.of(t)


class _Layout:
    """Where the local tensors of a type sit on the mesh."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh

    def key_axes(self, t: DTensorType) -> tuple[str, ...]:
        mentioned = set(t.axes)
        return tuple(a for a in self.mesh.axis_names if a in mentioned)

    def coords(self, axes: Sequence[str]) -> Iterator[dict[str, int]]:
        for c in itertools.product(*(range(self.mesh[a]) for a in axes)):
            yield dict(zip(axes, c, strict=True))

    def key(self, t: DTensorType, at: Mapping[str, int]) -> tuple[int, ...]:
        try:
            return tuple(at[a] for a in self.key_axes(t))
        except KeyError as e:
            raise SpmdInterpreterError(f"{t} varies along axis {e}, which is not in scope "
                                       "here") from None

    def block(self, t: DTensorType, d: int, at: Mapping[str, int]) -> slice:
        """The slice of dimension d held at coordinates `at`: d's axes index its tiles
        major to minor."""
        axes, n = t.dims[d]
        index = 0
        for a in axes:
            index = index * self.mesh[a] + at[a]
        size = tile_size(n, math.prod(self.mesh[a] for a in axes))
        return slice(index * size, (index + 1) * size)

    def padded(self, t: DTensorType) -> tuple[int, ...]:
        """Each dimension's size padded to a multiple of its axes' (its own if they
        divide it): the blocks tile the padded dimension."""
        return tuple(padded_size(n, math.prod(self.mesh[a] for a in axes))
                     for axes, n in t.dims)

    def split(self, t: DTensorType, globals_: Mapping[tuple[int, ...], Any]) -> Tiles:
        """The local tensors of type t, given the global tensor of each stacked slice."""
        tiles: Tiles = {}
        padded = self.padded(t)
        for at in self.coords(self.key_axes(t)):
            g = globals_[tuple(at[a] for a in t.stacked)]
            for d, size in enumerate(padded):
                g = pad_dim(g, d, size)
            tiles[self.key(t, at)] = g[tuple(self.block(t, d, at) for d in range(t.rank))]
        return tiles

    def assemble(self, t: DTensorType, tiles: Tiles) -> dict[tuple[int, ...], Any]:
        """The global tensor of each stacked slice of a value of type t."""
        blocks: dict[tuple[int, ...], list] = {}
        for at in self.coords(self.key_axes(t)):
            blocks.setdefault(tuple(at[a] for a in t.stacked), []).append(
                (tuple(self.block(t, d, at) for d in range(t.rank)), tiles[self.key(t, at)]))
        padded = self.padded(t)
        unpad = tuple(slice(0, n) for n in t.sizes)  # the padding of the blocks is dropped
        return {s: assembled(padded, t.dtype, b)[unpad] for s, b in blocks.items()}


class SpmdInterpreter:
    def __init__(self, fn: Function) -> None:
        mesh = fn.attributes.get("mesh")
        if not isinstance(mesh, Mapping):
            raise SpmdInterpreterError(f"function @{fn.name} needs its mesh as a mapping in "
                                       f"attributes['mesh'], got {mesh!r}")
        self.fn = fn
        self.layout = _Layout(mesh if isinstance(mesh, Mesh) else Mesh(mesh))

    def __call__(self, *args: Any) -> list[Any]:
        if len(args) != len(self.fn.args):
            raise SpmdInterpreterError(f"expected {len(self.fn.args)} arguments, got {len(args)}")
        env: dict[Value, Tiles] = {}
        for a, x in zip(self.fn.args, args, strict=True):
            t = _dtensor(a.type)
            if t.stacked or tuple(np.shape(x)) != t.sizes:
                raise SpmdInterpreterError(f"argument %{a.name} of type {t} cannot hold an "
                                           f"array of shape {np.shape(x)}")
            env[a] = self.layout.split(t, {(): sliceable(x)})
        for op in self.fn.ops:
            for r, tiles in zip(op.results, self._eval(op, env), strict=True):
                env[r] = tiles
        outs = []
        for v in self.fn.results:
            t = _dtensor(v.type)
            if t.stacked:
                raise SpmdInterpreterError(f"result of type {t} has stacked axes: no global "
                                           "value")
            outs.append(jnp.asarray(self.layout.assemble(t, env[v])[()]))
        return outs

    def _eval(self, op: Op, env: dict[Value, Tiles]) -> list[Tiles]:
        if op.name == EXECUTE:
            return self._execute(op, env)
        if op.name == TILE_REDUCE:
            return [self._tile_reduce(op, env[op.operands[0]])]
        if op.name == REDISTRIBUTE:
            (x,), (r,) = op.operands, op.results
            globals_ = self.layout.assemble(_dtensor(x.type), env[x])
            return [self.layout.split(_dtensor(r.type), globals_)]
        # A top-level op: op(gamma(x)) on whole tensors.
        operands = {}
        for v in op.operands:
            if _dtensor(v.type).axes:
                raise SpmdInterpreterError(f"{op.name} outside an execute reads {v.type}, "
                                           "which is not the same on every device")
            operands[v] = env[v][()]
        return [{(): out} for out in eval_alike(op, operands, (), self._sizes)]

    def _execute(self, op: Op, env: dict[Value, Tiles]) -> list[Tiles]:
        axes = op.params["axes"]
        region = op.regions[0]
        ranges, locals_ = region.args[:len(axes)], region.args[len(axes):]
        coords = list(self.layout.coords(axes))
        # One environment per coordinate; the body runs op by op across all of them.
        inners: list[dict[Value, Any]] = []
        for at in coords:
            inner: dict[Value, Any] = {r: at[a] for r, a in zip(ranges, axes, strict=True)}
            for x, y in zip(op.operands, locals_, strict=True):
                inner[y] = env[x][self.layout.key(_dtensor(x.type), at)]
            inners.append(inner)
        for body_op in region.ops:
            if lockstep_axes(body_op) & set(axes):
                self._lockstep(body_op, axes, inners)
                continue
            for inner in inners:
                inner.update(zip(body_op.results,
                                 eval_alike(body_op, inner, axes, self._sizes), strict=True))
        outs: list[Tiles] = [{} for _ in op.results]
        for at, inner in zip(coords, inners, strict=True):
            for out, r, y in zip(outs, op.results, region.yields, strict=True):
                out[self.layout.key(r.type, at)] = inner[y]
        return outs

    def _lockstep(self, op: Op, axes: Sequence[str], inners: list[dict[Value, Any]]) -> None:
        """Run op at every coordinate of `axes` at once (`inners` in coordinate order)."""
        grid = tuple(self.layout.mesh[a] for a in axes)
        stacked = [jnp.stack([inner[v] for inner in inners]).reshape(grid + v.type.shape)
                   for v in op.operands]
        outs = in_lockstep(lambda *xs: eval_alike(
            op, dict(zip(op.operands, xs, strict=True)), axes, self._sizes), axes, *stacked)
        for n, inner in enumerate(inners):
            at = np.unravel_index(n, grid)
            inner.update((r, out[at]) for r, out in zip(op.results, outs, strict=True))

    def _sizes(self) -> Mapping[str, int]:
        return self.layout.mesh

    def _tile_reduce(self, op: Op, tiles: Tiles) -> Tiles:
        axis, action = op.params["axis"], op.params["action"]
        (x,), (r,) = op.operands, op.results
        if isinstance(action, Tile):
            # The axis moves from the stacked axes into dimension d: the same devices
            # hold the same local tensors, only the type's view of them changes.
            return dict(tiles)
        out: Tiles = {}
        for at in self.layout.coords(self.layout.key_axes(r.type)):
            parts = [tiles[self.layout.key(x.type, {**at, axis: j})]
                     for j in range(self.layout.mesh[axis])]
            out[self.layout.key(r.type, at)] = combine(action, parts)
        return out


def interpret_spmd(fn: Function, *args: Any) -> list[Any]:
    """Run an SPMD function on global arguments; returns its global results. Each op runs
    eagerly: an execute's body runs once per coordinate, and the coordinates' ops of one
    shape share a compilation, which one program of every coordinate's ops (`jax.jit`)
    would not (the transformer test of tests/spmd took 55 s in the suite that way)."""
    return SpmdInterpreter(fn)(*args)
