"""Structural verifier: SSA dominance with region scoping, and per-op type rules.

Dialects register type rules per op name; primitive ops are checked against JAX's own
shape inference when `check_primitives` is set.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from partir.ir.function import Function
from partir.ir.ops import Op, Region
from partir.ir.types import TensorType
from partir.ir.values import Value


class VerificationError(Exception):
    pass


TYPE_RULES: dict[str, Callable[[Op], str | None]] = {}


def register_type_rule(name: str) -> Callable:
    def deco(fn: Callable[[Op], str | None]) -> Callable:
        TYPE_RULES[name] = fn
        return fn
    return deco


def _check_primitive(op: Op) -> str | None:
    if not all(isinstance(v.type, TensorType) for v in op.operands + op.results):
        return None  # ops on distributed types are checked by their dialect's rules
    if op.regions:
        return None  # control flow: its registered type rule reads its regions' types
    avals = [jax.ShapeDtypeStruct(v.type.shape, v.type.dtype) for v in op.operands]
    params = {k: v for k, v in op.params.items() if not k.startswith("_")}
    try:
        out = jax.eval_shape(lambda *xs: op.prim.bind(*xs, **params), *avals)
    except Exception as e:  # JAX's own message says what is wrong
        return f"JAX rejects the op: {e}"
    outs = out if op.prim.multiple_results else [out]
    for r, o in zip(op.results, outs, strict=True):
        if tuple(o.shape) != r.type.shape or o.dtype != r.type.dtype:
            return f"result type {r.type} but JAX infers {TensorType(tuple(o.shape), o.dtype)}"
    return None


def verify(fn: Function, check_primitives: bool = False) -> None:
    """Raise VerificationError on a use before definition, a value defined twice, or a
    type mismatch."""
    defined: set[Value] = set()

    def define(v: Value, op: Op | None) -> None:
        if v in defined:
            raise VerificationError(f"value %{v.name or v.id} defined twice ({op})")
        defined.add(v)

    def check_uses(values: list[Value], scope: list[set[Value]], where: str) -> None:
        for v in values:
            if not any(v in s for s in scope):
                raise VerificationError(f"%{v.name or v.id} used before its definition {where}")

    def walk(ops: list[Op], scope: list[set[Value]]) -> None:
        for op in ops:
            check_uses(op.operands, scope, f"in {op.name} at {op.loc}")
            for region in op.regions:
                walk_region(region, scope)
            rule = TYPE_RULES.get(op.name)
            msg = rule(op) if rule else None
            if msg is None and rule is None and check_primitives and op.prim is not None:
                msg = _check_primitive(op)
            if msg:
                raise VerificationError(f"{op.name} at {op.loc}: {msg}")
            for r in op.results:
                define(r, op)
                scope[-1].add(r)

    def walk_region(region: Region, scope: list[set[Value]]) -> None:
        inner: set[Value] = set()
        for a in region.args:
            define(a, None)
            inner.add(a)
        walk(region.ops, [*scope, inner])
        check_uses(region.yields, [*scope, inner], "in yield")

    top: set[Value] = set()
    for a in fn.args:
        define(a, None)
        top.add(a)
    walk(fn.ops, [top])
    check_uses(fn.results, [top], "in return")
