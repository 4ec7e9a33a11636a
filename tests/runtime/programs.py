"""Hand-built PartIR:HLO programs for the runtime tests, and numpy references.

Programs are written directly in the IR (device-local types, collectives named as in the
HLO contract), independently of any lowering. Primitive ops are traced one at a time
from a small JAX function on the local operand types.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from partir.frontend import inline_jaxpr
from partir.ir import Function, Op, TensorType, Value
from partir.mesh import Mesh

F32 = np.dtype("float32")
MESH = Mesh({"B": 4, "M": 2})


def local_shape(global_shape: Sequence[int], sharding, mesh: Mesh) -> tuple[int, ...]:
    return tuple(n // math.prod(mesh[a] for a in axes)
                 for n, axes in zip(global_shape, sharding, strict=True))


class Builder:
    """Appends ops to a function under construction; values are device-local."""

    def __init__(self, mesh: Mesh = MESH, name: str = "main") -> None:
        self.mesh = mesh
        self.name = name
        self.args: list[Value] = []
        self.in_shardings: list[Any] = []
        self.ops: list[Op] = []

    def arg(self, name: str, global_shape: Sequence[int], sharding, dtype=F32) -> Value:
        v = Value(TensorType(local_shape(global_shape, sharding, self.mesh), np.dtype(dtype)),
                  name=name)
        self.args.append(v)
        self.in_shardings.append(sharding)
        return v

    def op(self, name: str, operands: Sequence[Value], result_type, prim=None, /,
           **params) -> Value:
        result = Value(result_type)
        self.ops.append(Op(name, list(operands), [result], params, prim=prim))
        return result

    def collective(self, name: str, x: Value, shape: Sequence[int], /, **params) -> Value:
        return self.op(f"hlo.{name}", [x], x.type.with_shape(tuple(shape)), **params)

    def axis_index(self, axis: str) -> Value:
        return self.op("hlo.axis_index", [], TensorType((), np.dtype("int32")), axis=axis)

    def prim(self, f: Callable[..., Any], *operands: Value) -> Value:
        """The single primitive of `f` applied to operands (traced on their types)."""
        avals = [jax.ShapeDtypeStruct(v.type.shape, v.type.dtype) for v in operands]
        jaxpr = jax.make_jaxpr(f)(*avals).jaxpr
        (eqn,) = jaxpr.eqns
        (out,) = eqn.outvars
        return self.op(eqn.primitive.name, operands,
                       TensorType(tuple(out.aval.shape), np.dtype(out.aval.dtype)),
                       eqn.primitive, **eqn.params)

    def traced(self, f: Callable[..., Any], *operands: Value) -> list[Value]:
        """The ops of `f` on operands (traced on their types), inlined: a local
        computation of several primitives, e.g. a tile offset from axis indices."""
        avals = [jax.ShapeDtypeStruct(v.type.shape, v.type.dtype) for v in operands]
        ops, results = inline_jaxpr(jax.make_jaxpr(f)(*avals), operands)
        self.ops.extend(ops)
        return results

    def build(self, results: Sequence[Value], out_shardings: Sequence[Any]) -> Function:
        return Function(self.name, self.args, self.ops, list(results),
                        result_names=[f"out{k}" for k in range(len(results))],
                        attributes={"mesh": self.mesh,
                                    "in_shardings": tuple(self.in_shardings),
                                    "out_shardings": tuple(out_shardings)})


def normal(shape: Sequence[int], seed: int = 0, dtype=F32) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=tuple(shape)).astype(dtype)


def chain_program(fsdp: bool = False) -> Function:
    """The paper's device-local MLP chain (sec. 6) on {"B":4, "M":2}: x batch-sharded, w1
    and w2 Megatron-sharded over M, the partial products all-reduced over M, plus x. With
    `fsdp` the weights are also sharded over B and all-gathered before use (Z3)."""
    b = Builder()
    x = b.arg("x", (256, 8), (("B",), ()))
    if fsdp:
        w1 = b.collective("all_gather", b.arg("w1", (8, 16), (("B",), ("M",))), (8, 8),
                          axes=(("B",), ()))
        w2 = b.collective("all_gather", b.arg("w2", (16, 8), (("M",), ("B",))), (8, 8),
                          axes=((), ("B",)))
    else:
        w1 = b.arg("w1", (8, 16), ((), ("M",)))
        w2 = b.arg("w2", (16, 8), (("M",), ()))
    x1 = b.prim(lambda a, c: a @ c, x, w1)
    x2 = b.prim(lambda a, c: a @ c, x1, w2)
    r = b.collective("all_reduce", x2, (64, 8), axes=("M",), monoid="add")
    s = b.prim(lambda a, c: a + c, r, x)
    return b.build([s], [(("B",), ())])


def chain_reference(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return x @ w1 @ w2 + x
