"""Sequential interpreter of PartIR:Core: the first correctness oracle.

Each `loop` runs its body once per index of its range, one iteration at a time; `#tile`
concatenates the iterations' results, `#sum` reduces them with the monoid, `any` checks
they are all equal. `slice` takes the index-th chunk and `index` is the iteration number.
Primitives replay through JAX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from partir.core.actions import AnyAction, Sum, Tile
from partir.core.dialect import INDEX, LOOP, SLICE
from partir.ir import Function, Op, Region, Value
from partir.ir.monoids import MONOIDS
from partir.ir.types import tile_size


class InterpreterError(Exception):
    pass


def pad_dim(x: Any, dim: int, size: int) -> Any:
    """x with dimension `dim` padded at its end to `size` (with zeros: the values there
    are arbitrary, and nothing correct may depend on them)."""
    if x.shape[dim] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, size - x.shape[dim])
    return jnp.pad(x, widths)


def combine(action, parts: list[Any], size: int | None = None) -> Any:
    """The result of a loop (or of a stacked axis) from its iterations' results; a
    `#tile` result is truncated to `size` when the tiles pad its dimension."""
    if isinstance(action, Tile):
        out = jnp.concatenate(parts, axis=action.dim)
        if size is not None and size != out.shape[action.dim]:
            out = lax.slice_in_dim(out, 0, size, axis=action.dim)
        return out
    if isinstance(action, Sum):
        acc = parts[0]
        for p in parts[1:]:
            acc = MONOIDS[action.monoid].combine(acc, p)
        return acc
    assert isinstance(action, AnyAction)
    first = np.asarray(parts[0])
    for p in parts[1:]:
        if not np.array_equal(first, np.asarray(p), equal_nan=True):
            raise InterpreterError("iterations of an `any` loop computed different values")
    return parts[0]


def eval_op(op: Op, env: Mapping[Value, Any]) -> list[Any]:
    """A Core op without regions: `slice`, `index`, `tag`, `constant` or a primitive, with
    range values in `env` bound to loop indices (or device coordinates)."""
    if op.name == SLICE:
        x, r = (env[v] for v in op.operands)
        n = op.operands[1].type.size
        dim = op.params["dim"]
        chunk = tile_size(x.shape[dim], n)
        return [jnp.take(pad_dim(x, dim, chunk * n), jnp.arange(r * chunk, (r + 1) * chunk),
                         axis=dim)]
    if op.name == INDEX:
        return [jnp.asarray(env[op.operands[0]], jnp.int32)]
    if op.name == "tag":
        return [env[op.operands[0]]]
    if op.name == "constant":
        return [jnp.asarray(op.params["value"])]
    params = {k: v for k, v in op.params.items() if not k.startswith("_")}
    outs = op.prim.bind(*(env[v] for v in op.operands), **params)
    return list(outs) if op.prim.multiple_results else [outs]


class Interpreter:
    def __init__(self, fn: Function) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> list[Any]:
        if len(args) != len(self.fn.args):
            raise InterpreterError(f"expected {len(self.fn.args)} arguments, got {len(args)}")
        env: dict[Value, Any] = {}
        for a, x in zip(self.fn.args, args, strict=True):
            if tuple(np.shape(x)) != a.type.shape:
                raise InterpreterError(f"argument %{a.name} has shape {np.shape(x)}, "
                                       f"expected {a.type.shape}")
            env[a] = jnp.asarray(x)
        self._run(self.fn.ops, env)
        return [env[v] for v in self.fn.results]

    def _run(self, ops: Sequence[Op], env: dict[Value, Any]) -> None:
        for op in ops:
            outs = self._eval(op, env)
            for r, o in zip(op.results, outs, strict=True):
                env[r] = o

    def _eval(self, op: Op, env: dict[Value, Any]) -> list[Any]:
        return self._loop(op, env) if op.name == LOOP else eval_op(op, env)

    def _loop(self, op: Op, env: dict[Value, Any]) -> list[Any]:
        region: Region = op.regions[0]
        (r,) = region.args
        per_iter: list[list[Any]] = []
        for i in range(op.params["size"]):
            inner = dict(env)
            inner[r] = i
            self._run(region.ops, inner)
            per_iter.append([inner[v] for v in region.yields])
        return [combine(a, [it[k] for it in per_iter],
                        res.type.shape[a.dim] if isinstance(a, Tile) else None)
                for k, (a, res) in enumerate(zip(op.params["actions"], op.results,
                                                 strict=True))]


def interpret(fn: Function, *args: Any) -> list[Any]:
    return Interpreter(fn)(*args)
