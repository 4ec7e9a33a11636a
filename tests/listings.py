"""Helpers for golden tests of IR listings, shared by the Core, SPMD and HLO suites."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from partir.ir import Op, TensorType, Value

F32 = np.dtype("float32")
_NAME = re.compile(r'%(?:"[^"]*"|[\w.$-]+)')


def normalize(text: str) -> str:
    """Rename values to %v0, %v1... in order of first appearance."""
    names: dict[str, str] = {}
    return _NAME.sub(lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), text)


def same_listing(a: str, b: str) -> bool:
    """Equal up to value names and whitespace."""
    return normalize(" ".join(a.split())) == normalize(" ".join(b.split()))


def f32(*shape: int) -> TensorType:
    return TensorType(shape, F32)


def matmul_op(a: Value, b: Value, name: str) -> Op:
    """A 2D `dot_general` op, with the parameters JAX gives `jnp.matmul`."""
    eqn = jax.make_jaxpr(jnp.matmul)(jax.ShapeDtypeStruct(a.type.shape, F32),
                                     jax.ShapeDtypeStruct(b.type.shape, F32)).eqns[0]
    out = Value(f32(a.type.shape[0], b.type.shape[1]), name)
    return Op("dot_general", [a, b], [out], dict(eqn.params), prim=eqn.primitive)
