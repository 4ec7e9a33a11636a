"""Evaluation of a PartIR:HLO function on device-local arrays: the body of the shard_map.

Ops run in program order on traced local arrays. Collectives (and `hlo.axis_index`, the
device's `lax.axis_index`) go through `COLLECTIVES`; `tag` is the identity; primitives
are re-bound with their localized public parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from partir.errors import ProgramError
from partir.ir import Function, Op, TensorType, Value
from partir.ir.dtypes import canonical
from partir.ir.evaluate import evaluate
from partir.ir.lax_collectives import COLLECTIVES
from partir.mesh import Mesh

_AXES_PER_DIM = ("hlo.all_slice", "hlo.all_gather", "hlo.reduce_scatter")


def run_local(fn: Function, mesh: Mesh, args: Sequence[Any]) -> list[Any]:
    """The device-local results of `fn` on device-local `args`; call inside a shard_map
    over `mesh`."""
    env: dict[Value, Any] = dict(zip(fn.args, args, strict=True))
    for op in fn.ops:
        outs = _eval(op, env, mesh)
        _check_results(op, outs)
        env.update(zip(op.results, outs, strict=True))
    return [env[v] for v in fn.results]


def _eval(op: Op, env: Mapping[Value, Any], mesh: Mesh) -> list[Any]:
    operands = [env[v] for v in op.operands]
    collective = COLLECTIVES.get(op.name)
    if collective is not None:
        _check_axes(op, mesh)
        try:
            return [collective(*operands, **op.params)]
        except ProgramError as e:
            raise ProgramError(f"{op.name}: {e.message}", loc=op.loc) from e
        except TypeError as e:
            raise ProgramError(f"{op.name} has operands {[str(v.type) for v in op.operands]} "
                               f"and params {op.params}, which do not fit it: {e}",
                               loc=op.loc) from e
    return evaluate(op, operands)


def _check_axes(op: Op, mesh: Mesh) -> None:
    params = op.params
    if op.name == "hlo.axis_index":
        named = [params.get("axis")]
    elif op.name in _AXES_PER_DIM:
        named = [a for dim_axes in params.get("axes", ()) for a in dim_axes]
    else:
        named = list(params.get("axes", ()))
    for axis in named:
        if axis not in mesh:
            raise ProgramError(f"{op.name} names axis {axis!r}, which is not in the mesh "
                               f"{mesh}", loc=op.loc)


def _check_results(op: Op, outs: list[Any]) -> None:
    """An op's computed local results must have the types the program declares: a
    mismatch means the program and the runtime disagree on an op's semantics."""
    if len(outs) != len(op.results):
        raise ProgramError(f"{op.name} computed {len(outs)} results, the program declares "
                           f"{len(op.results)}", loc=op.loc)
    for r, out in zip(op.results, outs, strict=True):
        if not isinstance(r.type, TensorType):
            continue
        got = TensorType(tuple(np.shape(out)), canonical(out.dtype))
        # A declared 64-bit type is what JAX computes in 32 bits when x64 is off (e.g.
        # constants the frontend took from numpy float64 values).
        if got != TensorType(tuple(r.type.shape), canonical(r.type.dtype)):
            raise ProgramError(f"{op.name} computes {got} on each device, the program "
                               f"declares {r.type}", loc=op.loc)
