"""Printer for the MLIR-like syntax of the paper's listings.

Op printers are registered per op name, so each dialect (Core, SPMD, HLO) registers the
syntax of its own ops next to their definition; ops without a printer use the generic
`%r = name(%a, %b) {params} : type` form.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from partir.ir.function import Function
from partir.ir.ops import Op, Region
from partir.ir.values import Value

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$.\-]*$")
# Parameters that carry no information for a reader of the listings.
_HIDDEN_PARAMS = {"out_sharding", "sharding", "accuracy", "out_dtype", "preferred_element_type"}


class Namer:
    """Gives each value a unique printable name, preferring its name hint.

    A hint used again gets the first free suffix `_1`, `_2`, ...; the search resumes where
    the previous one for that hint stopped (names are never freed), so naming a program
    takes linear time even when thousands of values share a hint."""

    def __init__(self) -> None:
        self._names: dict[Value, str] = {}
        self._used: set[str] = set()
        self._counter = 0
        self._next_suffix: dict[str, int] = {}
        self._quoted: dict[str, bool] = {}

    def __call__(self, v: Value) -> str:
        name = self._names.get(v)
        if name is None:
            name = self._fresh(v.name)
            self._names[v] = name
        return name

    def _fresh(self, hint: str | None) -> str:
        if hint is not None:
            quoted = self._quoted.get(hint)
            if quoted is None:
                quoted = self._quoted[hint] = _IDENT.match(hint) is None
            i = self._next_suffix.get(hint, 0)
            name = hint if i == 0 else f"{hint}_{i}"
            if quoted:
                name = f'"{name}"'
            while name in self._used:
                i += 1
                name = f'"{hint}_{i}"' if quoted else f"{hint}_{i}"
            self._next_suffix[hint] = i
        else:
            while str(self._counter) in self._used:
                self._counter += 1
            name = str(self._counter)
            self._counter += 1
        self._used.add(name)
        return name


class Printer:
    def __init__(self) -> None:
        self.namer = Namer()
        self.lines: list[str] = []

    def ref(self, v: Value) -> str:
        return "%" + self.namer(v)

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def results_prefix(self, op: Op) -> str:
        if not op.results:
            return ""
        return ", ".join(self.ref(r) for r in op.results) + " = "

    def result_types(self, op: Op) -> str:
        return ", ".join(str(r.type) for r in op.results)

    def print_op(self, op: Op, depth: int) -> None:
        printer = OP_PRINTERS.get(op.name, print_generic_op)
        printer(self, op, depth)

    def print_region_body(self, region: Region, depth: int) -> None:
        for op in region.ops:
            self.print_op(op, depth)
        if region.yields:
            self.emit(depth, "yield " + ", ".join(self.ref(v) for v in region.yields)
                      + " : " + ", ".join(str(v.type) for v in region.yields))


def format_param(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return repr(value.reshape(()).item())
        return f"dense<{value.dtype}[{','.join(map(str, value.shape))}]>"
    if isinstance(value, tuple):
        if type(value).__str__ is not tuple.__str__:  # e.g. a PRNG implementation: `fry`
            return str(value)
        return "[" + ", ".join(format_param(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    if hasattr(value, "eqns"):  # a jaxpr parameter (a scatter's combiner): not worth printing
        return "<jaxpr>"
    return str(value)


def format_params(params: dict[str, Any]) -> str:
    # keys starting with "_" are private to the stage that made the op
    items = [f"{k}={format_param(v)}" for k, v in sorted(params.items())
             if k not in _HIDDEN_PARAMS and v is not None and not k.startswith("_")]
    return " {" + ", ".join(items) + "}" if items else ""


def _is_plain_matmul(op: Op) -> bool:
    if op.name != "dot_general" or len(op.operands) != 2:
        return False
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    lhs, rhs = op.operands
    return (not lb and not rb and tuple(lc) == (1,) and tuple(rc) == (0,)
            and lhs.type.rank == 2 and rhs.type.rank == 2)


def print_generic_op(p: Printer, op: Op, depth: int) -> None:
    name = op.name
    params = op.params
    if _is_plain_matmul(op):  # the paper's sugar for a 2D dot_general
        name, params = "matmul", {}
    args = ", ".join(p.ref(v) for v in op.operands)
    p.emit(depth, f"{p.results_prefix(op)}{name}({args}){format_params(params)}"
                  f" : {p.result_types(op)}")
    for region in op.regions:
        p.emit(depth + 1, "^(" + ", ".join(f"{p.ref(a)}: {a.type}" for a in region.args)
               + "):")
        p.print_region_body(region, depth + 2)


def print_function(fn: Function) -> str:
    p = Printer()
    args = ",\n    ".join(f"{p.ref(a)}: {a.type}" for a in fn.args)
    attrs = ""
    if fn.attributes:
        attrs = " attributes {" + ", ".join(
            f"{k}={v}" for k, v in fn.attributes.items()) + "}"
    p.emit(0, f"func @{fn.name}({args}){attrs} {{")
    for op in fn.ops:
        p.print_op(op, 1)
    p.emit(1, "return " + ", ".join(p.ref(v) for v in fn.results)
           + " : " + ", ".join(str(v.type) for v in fn.results))
    p.emit(0, "}")
    return "\n".join(p.lines)


OP_PRINTERS: dict[str, Callable[[Printer, Op, int], None]] = {}


def register_op_printer(name: str) -> Callable:
    def deco(fn: Callable[[Printer, Op, int], None]) -> Callable:
        OP_PRINTERS[name] = fn
        return fn
    return deco
