"""Reference interpreter of PartIR:HLO: simulates every device of the mesh.

A value is one local array per device (devices are coordinate tuples in the mesh's axis
order). Arguments are split per `in_shardings`; local ops run on each device; collectives
combine the arrays of the devices that differ only on the axes they name; results are
assembled per `out_shardings`, checking that devices meant to hold the same tile do.

Devices holding the very same operand arrays compute a local op once and share the
result: replicated computations cost one evaluation, not one per device. A local op whose
bodies hold collectives (a loop's sync points) runs on every device at once, in lockstep.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from partir.core.interpreter import in_lockstep, lockstep_axes
from partir.hlo.ops import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_SLICE,
    ALL_TO_ALL,
    AXIS_INDEX,
    COLLECTIVE_PERMUTE,
    REDUCE_SCATTER,
    AxesPerDim,
    flat_axes,
)
from partir.ir import Function, Op, Value
from partir.ir.dtypes import assembled, sliceable, to_host
from partir.ir.evaluate import evaluate
from partir.ir.monoids import MONOIDS
from partir.mesh import Mesh

Device = tuple[int, ...]
Local = dict[Device, Any]  # device -> its local array


class HloInterpreterError(Exception):
    pass


class _Mesh:
    """Device coordinates and the chunk a device holds of a dimension split over axes."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.position = {a: i for i, a in enumerate(mesh.axis_names)}
        self.devices: list[Device] = list(itertools.product(*(range(n) for n in
                                                              mesh.values())))

    def coord(self, dev: Device, axis: str) -> int:
        return dev[self.position[axis]]

    def chunk_index(self, dev: Device, axes: Sequence[str]) -> int:
        index = 0
        for a in axes:  # major to minor
            index = index * self.mesh[a] + self.coord(dev, a)
        return index

    def block(self, dev: Device, shape: Sequence[int], axes: AxesPerDim) -> tuple[slice, ...]:
        """The chunk of an array of `shape` the device holds when each dimension is split
        over its axes."""
        out = []
        for n, dim_axes in zip(shape, axes, strict=True):
            size = n // math.prod(self.mesh[a] for a in dim_axes)
            i = self.chunk_index(dev, dim_axes)
            out.append(slice(i * size, (i + 1) * size))
        return tuple(out)

    def gathered_shape(self, shape: Sequence[int], axes: AxesPerDim) -> tuple[int, ...]:
        """The shape of the array whose chunks of `shape` are split over `axes`."""
        return tuple(n * math.prod(self.mesh[a] for a in dim_axes)
                     for n, dim_axes in zip(shape, axes, strict=True))

    def group(self, dev: Device, axes: Sequence[str]) -> list[Device]:
        """The devices that differ from dev only on `axes`, in coordinate order."""
        members = []
        for coords in itertools.product(*(range(self.mesh[a]) for a in axes)):
            d = list(dev)
            for a, c in zip(axes, coords, strict=True):
                d[self.position[a]] = c
            members.append(tuple(d))
        return members

    def group_key(self, dev: Device, axes: Sequence[str]) -> Device:
        named = {self.position[a] for a in axes}
        return tuple(c for i, c in enumerate(dev) if i not in named)


class HloInterpreter:
    def __init__(self, fn: Function) -> None:
        mesh = fn.attributes.get("mesh")
        if not isinstance(mesh, Mapping):
            raise HloInterpreterError(f"@{fn.name} needs its mesh in attributes['mesh']")
        self.fn = fn
        self.m = _Mesh(mesh if isinstance(mesh, Mesh) else Mesh(mesh))
        self.in_shardings = fn.attributes["in_shardings"]
        self.out_shardings = fn.attributes["out_shardings"]

    def __call__(self, *args: Any) -> list[Any]:
        if len(args) != len(self.fn.args):
            raise HloInterpreterError(f"expected {len(self.fn.args)} arguments, got {len(args)}")
        env: dict[Value, Local] = {}
        # Arguments (results) whose axes pad a dimension arrive (leave) unpadded: their
        # global shapes, None where not padded.
        in_sizes = self.fn.attributes.get("in_sizes") or (None,) * len(args)
        out_sizes = self.fn.attributes.get("out_sizes") or (None,) * len(self.fn.results)
        for a, x, sharding, size in zip(self.fn.args, args, self.in_shardings, in_sizes,
                                        strict=True):
            x = sliceable(x)
            want = self.m.gathered_shape(a.type.shape, sharding)
            if size is not None and x.shape == tuple(size):
                x = to_host(x)
                x = np.pad(x, [(0, w - n) for w, n in zip(want, x.shape, strict=False)]
                           + [(0, 0)] * (x.ndim - len(want)))
            if x.shape != want:
                raise HloInterpreterError(f"argument %{a.name or a.id} must be a global array "
                                          f"of shape {size or want}, got {x.shape}")
            env[a] = self._split(x, sharding)
        for op in self.fn.ops:
            for r, local in zip(op.results, self._eval(op, env), strict=True):
                env[r] = local
        outs = []
        for v, sharding, size in zip(self.fn.results, self.out_shardings, out_sizes,
                                     strict=True):
            out = self._assemble(v, env[v], sharding)
            if size is not None:
                out = out[tuple(slice(0, n) for n in size)]
            outs.append(jnp.asarray(out))
        return outs

    def _split(self, x: np.ndarray, sharding: AxesPerDim) -> Local:
        return {dev: x[self.m.block(dev, x.shape, sharding)] for dev in self.m.devices}

    def _assemble(self, v: Value, local: Local, sharding: AxesPerDim) -> np.ndarray:
        shape = self.m.gathered_shape(v.type.shape, sharding)
        filled: dict[tuple, tuple[tuple[slice, ...], Any]] = {}
        for dev in self.m.devices:
            block = self.m.block(dev, shape, sharding)
            key = tuple((s.start, s.stop) for s in block)
            if key not in filled:
                filled[key] = (block, local[dev])
                continue
            first, x = to_host(filled[key][1]), to_host(local[dev])
            if not np.array_equal(first, x, equal_nan=x.dtype.kind in "fc"):
                raise HloInterpreterError(
                    f"result %{v.name or v.id} has sharding {sharding}, but devices holding "
                    f"the same tile disagree (device {dev})")
        return assembled(shape, v.type.dtype, list(filled.values()))

    def _eval(self, op: Op, env: dict[Value, Local]) -> list[Local]:
        x = env[op.operands[0]] if op.operands else None
        if op.name == AXIS_INDEX:
            # One array per coordinate, shared by the devices at it (so that `_local`
            # computes what depends on the coordinate once per coordinate).
            axis = op.params["axis"]
            coords = [np.asarray(c, np.int32) for c in range(self.m.mesh[axis])]
            return [{dev: coords[self.m.coord(dev, axis)] for dev in self.m.devices}]
        if op.name == ALL_SLICE:
            return [self._all_slice(x, op.params["axes"])]
        if op.name == ALL_GATHER:
            return [self._all_gather(x, op.params["axes"])]
        if op.name == ALL_REDUCE:
            return [self._all_reduce(x, op.params["axes"], op.params["monoid"])]
        if op.name == REDUCE_SCATTER:
            axes = op.params["axes"]
            return [self._all_slice(self._all_reduce(x, flat_axes(axes), op.params["monoid"]),
                                    axes)]
        if op.name == ALL_TO_ALL:
            rank = op.operands[0].type.rank
            gather, slice_ = [()] * rank, [()] * rank
            gather[op.params["concat_dim"]] = slice_[op.params["split_dim"]] = op.params["axes"]
            return [self._all_slice(self._all_gather(x, tuple(gather)), tuple(slice_))]
        if op.name == COLLECTIVE_PERMUTE:
            return [self._collective_permute(x, op.params["axes"], op.params["pairs"])]
        if op.name.startswith("hlo."):
            raise HloInterpreterError(f"unknown PartIR:HLO op {op.name}")
        return self._local(op, env)

    def _all_slice(self, x: Local, axes: AxesPerDim) -> Local:
        return {dev: x[dev][self.m.block(dev, np.shape(x[dev]), axes)] for dev in self.m.devices}

    def _all_gather(self, x: Local, axes: AxesPerDim) -> Local:
        named = flat_axes(axes)
        out: Local = {}
        done: dict[Device, Any] = {}
        for dev in self.m.devices:
            key = self.m.group_key(dev, named)
            if key not in done:
                shape = self.m.gathered_shape(np.shape(x[dev]), axes)
                done[key] = assembled(shape, x[dev].dtype, [
                    (self.m.block(member, shape, axes), x[member])
                    for member in self.m.group(dev, named)])
            out[dev] = done[key]
        return out

    def _all_reduce(self, x: Local, axes: Sequence[str], monoid: str) -> Local:
        out: Local = {}
        done: dict[Device, Any] = {}
        for dev in self.m.devices:
            key = self.m.group_key(dev, axes)
            if key not in done:
                parts = [x[member] for member in self.m.group(dev, axes)]
                acc = parts[0]
                for p in parts[1:]:  # in coordinate order, as a sequential loop would
                    acc = MONOIDS[monoid].combine(acc, p)
                done[key] = acc
            out[dev] = done[key]
        return out

    def _collective_permute(self, x: Local, axes: Sequence[str],
                            pairs: Sequence[tuple[int, int]]) -> Local:
        source = {t: s for s, t in pairs}
        out: Local = {}
        for dev in self.m.devices:
            s = source.get(self.m.chunk_index(dev, axes))
            out[dev] = (jnp.zeros_like(x[dev]) if s is None
                        else x[self.m.group(dev, axes)[s]])
        return out

    def _local(self, op: Op, env: dict[Value, Local]) -> list[Local]:
        if lockstep_axes(op):
            return self._lockstep(op, env)
        outs: list[Local] = [{} for _ in op.results]
        memo: dict[tuple, list[Any]] = {}
        for dev in self.m.devices:
            operands = [env[v][dev] for v in op.operands]
            # Arrays compare by identity (env keeps them alive).
            key = tuple([id(a) for a in operands])
            if key not in memo:
                memo[key] = evaluate(op, operands)
            for out, r in zip(outs, memo[key], strict=True):
                out[dev] = r
        return outs


    def _lockstep(self, op: Op, env: dict[Value, Local]) -> list[Local]:
        grid = tuple(self.m.mesh.values())
        stacked = [jnp.stack([env[v][dev] for dev in self.m.devices]).reshape(
            grid + v.type.shape) for v in op.operands]
        outs = in_lockstep(lambda *xs: evaluate(op, xs), self.m.mesh.axis_names,
                           *stacked)
        return [{dev: out[dev] for dev in self.m.devices} for out in outs]


def interpret_hlo(fn: Function, *args: Any) -> list[Any]:
    """Run a PartIR:HLO function on global arguments (split per its in_shardings) on a
    simulated mesh; returns its global results (assembled per its out_shardings). Each op
    runs eagerly: the devices' local ops of one shape share a compilation, which a
    program of every device's ops (`jax.jit`) would not."""
    return HloInterpreter(fn)(*args)
